/* rows.cu — the moves of the expert-parallel dispatchers on CUDA tensors (rows.h; called
 * through rows.c, alltoall_cuda.c and allgather_cuda.c): rows gathered by a permutation or
 * scattered into per-peer slots, the (local id, weight) pairs packed for the exchange and
 * split after it (or, all gathered, the routes owned here picked out), the slots' padding
 * cleared by the received counts, each token's returned rows summed in f32, a gradient
 * picked back by position, outputs turned NaN on a device flag, and copies. One thread an
 * element (a row's bytes move in the widest unit its size and pointers allow); everything
 * on the caller's stream, no host read. */
#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe_dispatch/rows.h"

static unsigned grid(int64_t n) { return (unsigned)((n + 255) / 256); }

/* dst[p, :] = src[order[p] / k, :], rows of w units; order[p] < 0: a zero row. */
template <typename U>
__global__ void gather_rows(U *dst, const U *src, const int32_t *order, int64_t n, int64_t w, int64_t k) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * w) return;
    int64_t p = e / w, c = e - p * w;
    int32_t o = order[p];
    dst[e] = o >= 0 ? src[(int64_t)(o / k) * w + c] : U{};
}

/* The widest unit that divides the row and every base (then every row's start). */
static size_t unit_of(size_t row, const void *a, const void *b) {
    size_t al = row | (size_t)(uintptr_t)a | (size_t)(uintptr_t)b;
    return al % 16 == 0 ? 16 : al % 8 == 0 ? 8 : al % 4 == 0 ? 4 : al % 2 == 0 ? 2 : 1;
}

/* launch(U{}, w) with U that unit and w = the row's units: one switch for every row move. */
template <typename F>
static void by_unit(size_t row, const void *dst, const void *src, F launch) {
    switch (unit_of(row, dst, src)) {
    case 16: launch(uint4{}, (int64_t)(row / 16)); break;
    case 8: launch(uint2{}, (int64_t)(row / 8)); break;
    case 4: launch(uint32_t{}, (int64_t)(row / 4)); break;
    case 2: launch(uint16_t{}, (int64_t)(row / 2)); break;
    default: launch(uint8_t{}, (int64_t)row);
    }
}

extern "C" lk_status lk_ep_cuda_gather(void *dst, const void *src, const int32_t *order, int64_t n, int64_t k,
                                       size_t row, void *stream) {
    if (n == 0 || row == 0) return LK_OK;
    by_unit(row, dst, src, [&](auto u, int64_t w) {
        using U = decltype(u);
        gather_rows<U><<<grid(n * w), 256, 0, (cudaStream_t)stream>>>((U *)dst, (const U *)src, order, n, w, k);
    });
    LK_CUDA_LAUNCHED("moe_dispatch: rows gathered");
    return LK_OK;
}

/* dst[spos[r], :] = src[r / k, :], r < n: each route's token row into its slot. */
template <typename U>
__global__ void scatter_rows(U *dst, const U *src, const int32_t *spos, int64_t n, int64_t w, int64_t k) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * w) return;
    int64_t r = e / w, c = e - r * w;
    dst[(int64_t)spos[r] * w + c] = src[(r / k) * w + c];
}

extern "C" lk_status lk_ep_cuda_scatter(void *dst, const void *src, const int32_t *spos, int64_t n, int64_t k,
                                        size_t row, void *stream) {
    if (n == 0 || row == 0) return LK_OK;
    by_unit(row, dst, src, [&](auto u, int64_t w) {
        using U = decltype(u);
        scatter_rows<U><<<grid(n * w), 256, 0, (cudaStream_t)stream>>>((U *)dst, (const U *)src, spos, n, w, k);
    });
    LK_CUDA_LAUNCHED("moe_dispatch: rows scattered into slots");
    return LK_OK;
}

/* --- the device-count plan (alltoall_cuda.c) ------------------------------------------ */

/* owner[r] = ids[r] / El, or -1 for an id outside [0, E) (route.cu then raises its flag). */
__global__ void owners_of(const int32_t *ids, int64_t R, int32_t E, int32_t El, int32_t *owner) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= R) return;
    int32_t id = ids[r];
    owner[r] = id >= 0 && id < E ? id / El : -1;
}

extern "C" lk_status lk_ep_cuda_owners(const int32_t *ids, int64_t R, int64_t E, int64_t El, int32_t *owner,
                                       void *stream) {
    owners_of<<<grid(R), 256, 0, (cudaStream_t)stream>>>(ids, R, (int32_t)E, (int32_t)El, owner);
    LK_CUDA_LAUNCHED("moe_dispatch: routes' owners");
    return LK_OK;
}

/* spos[r] = o·B + (pos[r] - offs[o]) for route r of owner o (a bad id: route.cu sorted it
 * as owner 0); scnt[p] = offs[p + 1] - offs[p]. */
__global__ void slot_plan(const int32_t *owner, const int32_t *pos, const int64_t *offs, int64_t R, int P, int64_t B,
                          int32_t *spos, int64_t *scnt) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r < P) scnt[r] = offs[r + 1] - offs[r];
    if (r >= R) return;
    int32_t o = owner[r] < 0 ? 0 : owner[r];
    spos[r] = (int32_t)(o * B + (pos[r] - offs[o]));
}

extern "C" lk_status lk_ep_cuda_slots(const int32_t *owner, const int32_t *pos, const int64_t *offs, int64_t R,
                                      int P, int64_t B, int32_t *spos, int64_t *scnt, void *stream) {
    slot_plan<<<grid(R > P ? R : P), 256, 0, (cudaStream_t)stream>>>(owner, pos, offs, R, P, B, spos, scnt);
    LK_CUDA_LAUNCHED("moe_dispatch: routes' slots");
    return LK_OK;
}

/* meta[spos[r]] = (ids[r] % El, or -1 for a bad id so its owner's experts flag it; the
 * bits of w[r]). */
__global__ void pack_slots(int32_t *meta, const int32_t *ids, const float *w, const int32_t *spos, int64_t R,
                           int32_t E, int32_t El) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= R) return;
    int32_t id = ids[r];
    int64_t q = spos[r];
    meta[2 * q] = id >= 0 && id < E ? id % El : -1;
    meta[2 * q + 1] = __float_as_int(w[r]);
}

extern "C" lk_status lk_ep_cuda_meta_slots(int32_t *meta, const int32_t *ids, const float *w, const int32_t *spos,
                                           int64_t R, int64_t E, int64_t El, void *stream) {
    pack_slots<<<grid(R), 256, 0, (cudaStream_t)stream>>>(meta, ids, w, spos, R, (int32_t)E, (int32_t)El);
    LK_CUDA_LAUNCHED("moe_dispatch: routes' expert and weight packed into slots");
    return LK_OK;
}

/* Rows a slot of peer p holds: its count, or 0 with *flag raised when the peer sent a
 * count outside [0, B] (it broke the call's contract: a different bound). */
static __device__ __forceinline__ int64_t held(const int64_t *rcnt, int p, int64_t B, int *flag) {
    int64_t n = rcnt[p];
    if (n < 0 || n > B) {
        *flag = 1;
        return 0;
    }
    return n;
}

/* Slot row q = p·B + i: (local id, weight) from meta when i < rcnt[p], else (0, 0), a
 * padding row the experts run as zero. */
__global__ void unpack_slots(const int32_t *meta, const int64_t *rcnt, int64_t B, int64_t n, int32_t *ids, float *w,
                             int *flag) {
    int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (q >= n) return;
    int p = (int)(q / B);
    bool real = q - p * B < held(rcnt, p, B, flag);
    ids[q] = real ? meta[2 * q] : 0;
    w[q] = real ? __int_as_float(meta[2 * q + 1]) : 0.0f;
}

extern "C" lk_status lk_ep_cuda_unmeta_slots(const int32_t *meta, const int64_t *rcnt, int P, int64_t B, int32_t *ids,
                                             float *w, int *flag, void *stream) {
    unpack_slots<<<grid(P * B), 256, 0, (cudaStream_t)stream>>>(meta, rcnt, B, P * B, ids, w, flag);
    LK_CUDA_LAUNCHED("moe_dispatch: received expert and weight split, padding cleared");
    return LK_OK;
}

/* The padding rows of every slot (i >= rcnt[p]) zeroed, w units a row. */
template <typename U>
__global__ void clear_padding(U *rows, const int64_t *rcnt, int64_t B, int64_t n, int64_t w, int *flag) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * w) return;
    int64_t q = e / w;
    int p = (int)(q / B);
    if (q - p * B >= held(rcnt, p, B, flag)) rows[e] = U{};
}

extern "C" lk_status lk_ep_cuda_clear_padding(void *rows, const int64_t *rcnt, int P, int64_t B, size_t row, int *flag,
                                              void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    int64_t n = P * B;
    if (unit_of(row, rows, rows) == 16) {
        int64_t w = (int64_t)(row / 16);
        clear_padding<uint4><<<grid(n * w), 256, 0, st>>>((uint4 *)rows, rcnt, B, n, w, flag);
    } else {
        int64_t w = (int64_t)(row / 2);   /* rows of f32 or bf16 elements: an even byte count */
        clear_padding<uint16_t><<<grid(n * w), 256, 0, st>>>((uint16_t *)rows, rcnt, B, n, w, flag);
    }
    LK_CUDA_LAUNCHED("moe_dispatch: padding rows cleared");
    return LK_OK;
}

/* --- the device-count plan (allgather_cuda.c) ------------------------------------------ */

/* meta[2r ..] = (ids[r], bits of w[r]), r < R; thread 0 also writes the token count and
 * clears the flag. */
__global__ void pack_routes(int32_t *meta, int64_t *cnt, int *flag, const int32_t *ids, const float *w, int64_t R,
                            int64_t T) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r == 0) cnt[0] = T, *flag = 0;
    if (r >= R) return;
    meta[2 * r] = ids[r];
    meta[2 * r + 1] = __float_as_int(w[r]);
}

extern "C" lk_status lk_ep_cuda_pack_routes(int32_t *meta, int64_t *cnt, int *flag, const int32_t *ids, const float *w,
                                            int64_t R, int64_t T, void *stream) {
    pack_routes<<<grid(R > 1 ? R : 1), 256, 0, (cudaStream_t)stream>>>(meta, cnt, flag, ids, w, R, T);
    LK_CUDA_LAUNCHED("moe_dispatch: routes packed for the all-gather");
    return LK_OK;
}

/* Gathered route q = (slot p, token i, route j), q = (p·Tb + i)·k + j: owned here or
 * (0, 0, -1). Padding tokens (i >= cnt[p]) are owned by no one and never flagged. */
__global__ void own_routes(const int32_t *meta, const int64_t *cnt, int64_t Tb, int64_t k, int64_t n, int32_t E,
                           int32_t e0, int32_t El, int32_t *lid, float *w, int32_t *own, int *flag) {
    int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (q >= n) return;
    int64_t t = q / k;
    int p = (int)(t / Tb);
    bool real = t - p * Tb < held(cnt, p, Tb, flag);
    int32_t id = meta[2 * q];
    if (real && (id < 0 || id >= E)) *flag = 1;
    bool mine = real && id >= e0 && id - e0 < El;
    lid[q] = mine ? id - e0 : 0;
    w[q] = mine ? __int_as_float(meta[2 * q + 1]) : 0.0f;
    own[q] = mine ? (int32_t)q : -1;
}

extern "C" lk_status lk_ep_cuda_own_routes(const int32_t *meta, const int64_t *cnt, int P, int64_t Tb, int64_t k,
                                           int64_t E, int64_t e0, int64_t El, int32_t *lid, float *w, int32_t *own,
                                           int *flag, void *stream) {
    int64_t n = P * Tb * k;
    own_routes<<<grid(n), 256, 0, (cudaStream_t)stream>>>(meta, cnt, Tb, k, n, (int32_t)E, (int32_t)e0, (int32_t)El,
                                                          lid, w, own, flag);
    LK_CUDA_LAUNCHED("moe_dispatch: gathered routes owned here picked");
    return LK_OK;
}

/* dst[0..n) = NaN when *flag (a bad id or count), else untouched. */
template <typename T>
__global__ void nan_if(const int *flag, T *dst, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n && *flag) dst[i] = lk_from_f32<T>(__int_as_float(0x7fffffff));
}

extern "C" lk_status lk_ep_cuda_nan_if(const int *flag, void *dst, lk_dtype dt, int64_t n, void *stream) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dt == LK_F32) nan_if<float><<<grid(n), 256, 0, st>>>(flag, (float *)dst, n);
    else nan_if<lk_bf16_t><<<grid(n), 256, 0, st>>>(flag, (lk_bf16_t *)dst, n);
    LK_CUDA_LAUNCHED("moe_dispatch: outputs poisoned on a bad id");
    return LK_OK;
}

/* --- copies --------------------------------------------------------------------------- */



__global__ void pack_meta(int32_t *meta, const int32_t *ids, const float *w, const int32_t *order, int64_t n,
                          int32_t El) {
    int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (p >= n) return;
    int32_t r = order[p];
    meta[2 * p] = ids[r] % El;
    meta[2 * p + 1] = __float_as_int(w[r]);
}

extern "C" lk_status lk_ep_cuda_meta(int32_t *meta, const int32_t *ids, const float *w, const int32_t *order,
                                     int64_t n, int64_t El, void *stream) {
    if (n == 0) return LK_OK;
    pack_meta<<<grid(n), 256, 0, (cudaStream_t)stream>>>(meta, ids, w, order, n, (int32_t)El);
    LK_CUDA_LAUNCHED("moe_dispatch: routes' expert and weight packed");
    return LK_OK;
}

__global__ void split_meta(const int32_t *meta, int32_t *ids, float *w, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    ids[i] = meta[2 * i];
    w[i] = __int_as_float(meta[2 * i + 1]);
}

extern "C" lk_status lk_ep_cuda_unmeta(const int32_t *meta, int32_t *ids, float *w, int64_t n, void *stream) {
    if (n == 0) return LK_OK;
    split_meta<<<grid(n), 256, 0, (cudaStream_t)stream>>>(meta, ids, w, n);
    LK_CUDA_LAUNCHED("moe_dispatch: received expert and weight split");
    return LK_OK;
}

/* dst[t, c] = Σ_j src[pos[t·k + j], c] over pos >= 0 (pos NULL: t·k + j), f32, rounded once. */
template <typename Ti, typename To>
__global__ void combine_rows(To *dst, const Ti *src, const int32_t *pos, int64_t n, int64_t k, int64_t h) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * h) return;
    int64_t t = e / h, c = e - t * h;
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        int64_t p = pos ? (int64_t)pos[t * k + j] : t * k + j;
        if (p >= 0) s += lk_to_f32(src[p * h + c]);
    }
    dst[e] = lk_from_f32<To>(s);
}

template <typename Ti>
static void combine_from(void *dst, lk_dtype dst_dt, const void *src, const int32_t *pos, int64_t n, int64_t k,
                         int64_t H, cudaStream_t st) {
    if (dst_dt == LK_F32)
        combine_rows<Ti, float><<<grid(n * H), 256, 0, st>>>((float *)dst, (const Ti *)src, pos, n, k, H);
    else
        combine_rows<Ti, lk_bf16_t><<<grid(n * H), 256, 0, st>>>((lk_bf16_t *)dst, (const Ti *)src, pos, n, k, H);
}

extern "C" lk_status lk_ep_cuda_combine(void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt,
                                        const int32_t *pos, int64_t n, int64_t k, int64_t H, void *stream) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (src_dt == LK_F32) combine_from<float>(dst, dst_dt, src, pos, n, k, H, st);
    else combine_from<lk_bf16_t>(dst, dst_dt, src, pos, n, k, H, st);
    LK_CUDA_LAUNCHED("moe_dispatch: rows summed per token");
    return LK_OK;
}

__global__ void pick_by_pos(float *dst, const float *src, const int32_t *pos, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = pos[i] >= 0 ? src[pos[i]] : 0.0f;
}

extern "C" lk_status lk_ep_cuda_pick(float *dst, const float *src, const int32_t *pos, int64_t n, void *stream) {
    if (n == 0) return LK_OK;
    pick_by_pos<<<grid(n), 256, 0, (cudaStream_t)stream>>>(dst, src, pos, n);
    LK_CUDA_LAUNCHED("moe_dispatch: d_topk_weights picked back");
    return LK_OK;
}

extern "C" lk_status lk_ep_cuda_copy(void *dst, const void *src, size_t bytes, int wait, void *stream) {
    if (bytes && dst != src) LK_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    if (wait) LK_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return LK_OK;
}

extern "C" lk_status lk_ep_cuda_sync(void *stream) {
    LK_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return LK_OK;
}
