/* embedding.cu — the token embedding on CUDA (cuda_train.h). Forward: one thread per
 * 16-byte group of an output row (W = 1 for odd widths), the row gathered from the
 * table. Backward, deterministic without atomics: the (id, token) pairs are sorted by id
 * with CUB's stable radix sort (equal ids keep token order), then a block per (sorted
 * position, column slice) whose position starts a run of equal ids sums the run's rows
 * in f32, in token order, and adds the sum into dweight once. Blocks at the other
 * positions return at once; a frequent id (padding) is one long serial run per slice.
 * Bad ids: a flag and the first bad token (atomicMin) in the workspace, read back after
 * one stream synchronization. */
/* CUB's function-local statics (per-device caches) are vague-linkage symbols: exported,
 * a process that also loads another copy of the same CUB version with RTLD_GLOBAL (torch,
 * through bench/peers_cuda.py's ctypes) unifies them and destroys them twice at exit
 * (free(): invalid pointer). Our own namespace, no NVTX ranges, and hidden visibility
 * keep this copy private. */
#define CUB_WRAPPED_NAMESPACE llmkern_cub
#define CCCL_DISABLE_NVTX
#pragma GCC visibility push(hidden)
#include <cub/device/device_radix_sort.cuh>
#pragma GCC visibility pop
typedef llmkern_cub::cub::DeviceRadixSort SORT;
#include "llmkern/cuda_train.h"
#include "ops/train_cuda/multi_tensor.cuh"

#define THREADS 128

typedef struct {
    int bad;
    long long first;   /* the first bad token */
} badflag;

static __device__ __forceinline__ int64_t id_at(const void *ids, int i64, int64_t t) {
    return i64 ? static_cast<const int64_t *>(ids)[t] : static_cast<const int32_t *>(ids)[t];
}

static __device__ __forceinline__ void flag_bad(badflag *f, int64_t t) {
    f->bad = 1;
    atomicMin(&f->first, (long long)t);
}

template <typename T, int W>
__global__ void __launch_bounds__(THREADS) gather(const T *w, const void *ids, int i64, int64_t T_, int64_t V,
                                                  int64_t H, T *out, badflag *f) {
    int64_t groups = H / W, gid = blockIdx.x * (int64_t)THREADS + threadIdx.x;
    if (gid >= T_ * groups) return;
    int64_t t = gid / groups, c = (gid - t * groups) * W, id = id_at(ids, i64, t);
    float v[W];
    if (id >= 0 && id < V) {
        lk_ldw<T, W>(w + id * H + c, v, false);   /* table rows may repeat: keep them cached */
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) v[j] = __int_as_float(0x7fc00000);
        if (c == 0 && f) flag_bad(f, t);
    }
    lk_stw<T, W>(out + t * H + c, v);
}

/* Sort keys: the id (bad ones flagged; they never reach the accumulation). */
__global__ void make_keys(const void *ids, int i64, int64_t T_, int64_t V, uint32_t *keys, uint32_t *tok,
                          badflag *f) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T_) return;
    int64_t id = id_at(ids, i64, t);
    if (id < 0 || id >= V) {
        if (f) flag_bad(f, t);
        id = V;
    }
    keys[t] = (uint32_t)id;
    tok[t] = (uint32_t)t;
}

/* Block (i, slice): when sorted position i starts a run of one id, thread x sums the
 * run's dout rows over columns slice·THREADS·W + x·W .. +W and adds them to dweight. */
template <typename T, typename D, int W>
__global__ void __launch_bounds__(THREADS) segment_sum(const uint32_t *keys, const uint32_t *tok, int64_t T_,
                                                       int64_t H, const T *dout, D *dw) {
    int64_t i = blockIdx.x;
    uint32_t id = keys[i];
    if (i > 0 && keys[i - 1] == id) return;
    int64_t c = ((int64_t)blockIdx.y * THREADS + threadIdx.x) * W;
    if (c >= H) return;
    float acc[W], x[W];
#pragma unroll
    for (int j = 0; j < W; j++) acc[j] = 0.0f;
    for (int64_t k = i; k < T_ && keys[k] == id; k++) {
        lk_ldw<T, W>(dout + (int64_t)tok[k] * H + c, x);
#pragma unroll
        for (int j = 0; j < W; j++) acc[j] += x[j];
    }
    D *row = dw + (int64_t)id * H + c;
    lk_ldw<D, W>(row, x, false);
#pragma unroll
    for (int j = 0; j < W; j++) x[j] += acc[j];
    lk_stw<D, W>(row, x, false);
}

/* --- host ----------------------------------------------------------------------------------- */

static lk_status check_t(const char *fn, const char *name, const lk_tensor *t) {
    if (t == NULL || t->data == NULL) return lk_error(LK_EINVAL, "%s: %s: expected a tensor, got NULL", fn, name);
    if (t->device.type != LK_DEVICE_CUDA)
        return lk_error(LK_EINVAL, "%s: %s: expected a cuda tensor, got %s", fn, name, lk_device_name(t->device.type));
    if (!lk_tensor_is_contiguous(t)) return lk_error(LK_EINVAL, "%s: %s: expected contiguous", fn, name);
    return LK_OK;
}

/* ids, the table-shaped tensor ([V, H]) and the row-shaped one (T·H elements, last dim H). */
static lk_status check_all(const char *fn, const lk_tensor *ids, const lk_tensor *table, const char *tname,
                           const lk_tensor *rows, const char *rname, lk_ctx *ctx) {
    lk_status st = lk_mt_check_ctx(fn, ctx);
    if (st == LK_OK) st = check_t(fn, "ids", ids);
    if (st == LK_OK) st = check_t(fn, tname, table);
    if (st == LK_OK) st = check_t(fn, rname, rows);
    if (st != LK_OK) return st;
    if (ids->dtype != LK_I32 && ids->dtype != LK_I64)
        return lk_error(LK_EDTYPE, "%s: ids: expected i32 or i64, got %s", fn, lk_dtype_name(ids->dtype));
    if (table->dtype != LK_F32 && table->dtype != LK_BF16)
        return lk_error(LK_EDTYPE, "%s: %s: expected f32 or bf16, got %s", fn, tname, lk_dtype_name(table->dtype));
    if (rows->dtype != LK_F32 && rows->dtype != LK_BF16)
        return lk_error(LK_EDTYPE, "%s: %s: expected f32 or bf16, got %s", fn, rname, lk_dtype_name(rows->dtype));
    char b1[64], b2[64];
    if (table->ndim != 2 || table->shape[0] < 1 || table->shape[1] < 1 || table->shape[0] > 0x7ffffffe)
        return lk_error(LK_ESHAPE, "%s: %s: expected [V, H] with 1 <= V < 2^31, got %s", fn, tname,
                        lk_shape_str(table, b1, sizeof b1));
    int64_t T_ = lk_tensor_numel(ids), H = table->shape[1];
    if (T_ > 0x7fffffff) return lk_error(LK_ESHAPE, "%s: ids: expected < 2^31 tokens, got %lld", fn, (long long)T_);
    if (rows->ndim < 1 || rows->shape[rows->ndim - 1] != H || lk_tensor_numel(rows) != T_ * H)
        return lk_error(LK_ESHAPE, "%s: %s: expected %lld tokens (ids %s) of %lld, got %s", fn, rname, (long long)T_,
                        lk_shape_str(ids, b2, sizeof b2), (long long)H, lk_shape_str(rows, b1, sizeof b1));
    return LK_OK;
}

/* After the kernels: synchronizes, reads the flag and names the first bad token. */
static lk_status read_flag(const char *fn, const lk_tensor *ids, int64_t V, badflag *dflag, cudaStream_t s) {
    badflag f;
    LK_CUDA_TRY(cudaMemcpyAsync(&f, dflag, sizeof f, cudaMemcpyDeviceToHost, s));
    LK_CUDA_TRY(cudaStreamSynchronize(s));
    if (!f.bad) return LK_OK;
    int64_t id = 0;
    size_t es = lk_dtype_size(ids->dtype);
    LK_CUDA_TRY(cudaMemcpy(&id, static_cast<const char *>(ids->data) + f.first * es, es, cudaMemcpyDeviceToHost));
    if (es == 4) id = (int32_t)id;
    return lk_error(LK_EINVAL, "%s: ids: token %lld has id %lld, expected 0 <= id < %lld", fn, f.first, (long long)id,
                    (long long)V);
}

static lk_status flag_init(lk_ctx *ctx, badflag **f) {
    *f = static_cast<badflag *>(lk_arena_alloc(ctx->arena, sizeof(badflag)));
    if (*f == NULL) return lk_error(LK_EINTERNAL, "embedding (cuda): workspace smaller than its query");
    badflag h = {0, 0x7fffffffffffffffLL};
    LK_CUDA_TRY(cudaMemcpyAsync(*f, &h, sizeof h, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(ctx->stream)));
    /* pageable source: staged before the call returns, h may go */
    return LK_OK;
}

template <typename T>
static void launch_gather(const lk_tensor *w, const lk_tensor *ids, lk_tensor *out, badflag *f, cudaStream_t s) {
    int64_t T_ = lk_tensor_numel(ids), V = w->shape[0], H = w->shape[1];
    const int N = lk_vec<T>::N;
    int i64 = ids->dtype == LK_I64;
    const T *wp = static_cast<const T *>(w->data);
    T *op = static_cast<T *>(out->data);
    if (H % N == 0 && lk_aligned16(wp) && lk_aligned16(op))
        gather<T, N><<<(unsigned)lk_cdiv(T_ * (H / N), THREADS), THREADS, 0, s>>>(wp, ids->data, i64, T_, V, H, op, f);
    else
        gather<T, 1><<<(unsigned)lk_cdiv(T_ * H, THREADS), THREADS, 0, s>>>(wp, ids->data, i64, T_, V, H, op, f);
}

/* checked: the bad-id flag, read back after the kernels (a sync); else none. */
static lk_status forward(const lk_tensor *weight, const lk_tensor *ids, lk_tensor *out, lk_ctx *ctx, int checked) {
    static const char *fn = "embedding forward (cuda)";
    lk_status st = check_all(fn, ids, weight, "weight", out, "out", ctx);
    if (st != LK_OK) return st;
    if (out->dtype != weight->dtype)
        return lk_error(LK_EDTYPE, "%s: out: expected the weight's %s, got %s", fn, lk_dtype_name(weight->dtype),
                        lk_dtype_name(out->dtype));
    if (lk_tensor_numel(ids) == 0) return LK_OK;
    if (lk_cdiv(lk_tensor_numel(out), THREADS) > 0x7fffffff)
        return lk_error(LK_ESHAPE, "%s: out: more than 2^31 blocks of %d", fn, THREADS);
    cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
    size_t mark;
    badflag *f = NULL;
    st = lk_ctx_workspace_begin(ctx, fn, lk_arena_piece(sizeof(badflag)), &mark);
    if (st == LK_OK && checked) st = flag_init(ctx, &f);
    if (st == LK_OK) {
        if (weight->dtype == LK_BF16) launch_gather<lk_bf16_t>(weight, ids, out, f, s);
        else launch_gather<float>(weight, ids, out, f, s);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = lk_cuda_fail(e, "embedding forward (cuda): launch", __FILE__, __LINE__);
        else if (checked) st = read_flag(fn, ids, weight->shape[0], f, s);
    }
    lk_ctx_workspace_end(ctx, mark);
    return st;
}

extern "C" lk_status lk_cuda_embedding_forward(const lk_tensor *weight, const lk_tensor *ids, lk_tensor *out,
                                               lk_ctx *ctx) {
    return forward(weight, ids, out, ctx, 1);
}

extern "C" lk_status lk_cuda_embedding_forward_unchecked(const lk_tensor *weight, const lk_tensor *ids,
                                                         lk_tensor *out, lk_ctx *ctx) {
    return forward(weight, ids, out, ctx, 0);
}

static int end_bit(int64_t V) {   /* keys are 0..V: enough bits for V itself */
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= V) b++;
    return b;
}

static lk_status sort_temp(int64_t T_, int64_t V, size_t *bytes) {
    *bytes = 0;
    const uint32_t *in = nullptr;
    uint32_t *out = nullptr;
    LK_CUDA_TRY(SORT::SortPairs(nullptr, *bytes, in, out, in, out, (int)T_, 0, end_bit(V)));
    return LK_OK;
}

extern "C" lk_status lk_cuda_embedding_backward_workspace(int64_t tokens, int64_t vocab, size_t *bytes) {
    size_t temp;
    lk_status st = sort_temp(tokens, vocab, &temp);
    if (st != LK_OK) return st;
    *bytes = 4 * lk_arena_piece(4 * (size_t)tokens) + lk_arena_piece(temp) + lk_arena_piece(sizeof(badflag));
    return LK_OK;
}

template <typename T, typename D>
static void launch_segments(const uint32_t *keys, const uint32_t *tok, int64_t T_, int64_t H, const lk_tensor *dout,
                            lk_tensor *dw, cudaStream_t s) {
    const int N = lk_vec<T>::N < lk_vec<D>::N ? lk_vec<T>::N : lk_vec<D>::N;
    const T *g = static_cast<const T *>(dout->data);
    D *w = static_cast<D *>(dw->data);
    if (H % N == 0 && lk_aligned16(g) && lk_aligned16(w))
        segment_sum<T, D, N><<<dim3((unsigned)T_, (unsigned)lk_cdiv(H, THREADS * N)), THREADS, 0, s>>>(keys, tok, T_,
                                                                                                      H, g, w);
    else
        segment_sum<T, D, 1><<<dim3((unsigned)T_, (unsigned)lk_cdiv(H, THREADS)), THREADS, 0, s>>>(keys, tok, T_, H,
                                                                                                  g, w);
}

static lk_status backward(const lk_tensor *dout, const lk_tensor *ids, lk_tensor *dweight, lk_ctx *ctx,
                          int checked) {
    static const char *fn = "embedding backward (cuda)";
    lk_status st = check_all(fn, ids, dweight, "dweight", dout, "dout", ctx);
    if (st != LK_OK) return st;
    int64_t T_ = lk_tensor_numel(ids), V = dweight->shape[0], H = dweight->shape[1];
    if (T_ == 0) return LK_OK;
    if (lk_cdiv(H, THREADS) > 65535)
        return lk_error(LK_ESHAPE, "%s: dweight: expected H <= %d, got %lld", fn, 65535 * THREADS, (long long)H);
    size_t bytes, temp, mark;
    if ((st = lk_cuda_embedding_backward_workspace(T_, V, &bytes)) != LK_OK || (st = sort_temp(T_, V, &temp)) != LK_OK)
        return st;
    cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
    st = lk_ctx_workspace_begin(ctx, fn, bytes, &mark);
    badflag *f = NULL;
    if (st == LK_OK && checked) st = flag_init(ctx, &f);
    uint32_t *k[4] = {0};
    void *tmp = NULL;
    for (int i = 0; st == LK_OK && i < 4; i++)
        if ((k[i] = static_cast<uint32_t *>(lk_arena_alloc(ctx->arena, 4 * (size_t)T_))) == NULL)
            st = lk_error(LK_EINTERNAL, "%s: workspace smaller than its query", fn);
    if (st == LK_OK && (tmp = lk_arena_alloc(ctx->arena, temp)) == NULL)
        st = lk_error(LK_EINTERNAL, "%s: workspace smaller than its query", fn);
    if (st == LK_OK) {
        make_keys<<<(unsigned)lk_cdiv(T_, 256), 256, 0, s>>>(ids->data, ids->dtype == LK_I64, T_, V, k[0], k[1], f);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess)
            e = SORT::SortPairs(tmp, temp, k[0], k[2], k[1], k[3], (int)T_, 0, end_bit(V), s);
        if (e != cudaSuccess) st = lk_cuda_fail(e, "embedding backward (cuda): sort", __FILE__, __LINE__);
        else if (checked) st = read_flag(fn, ids, V, f, s);
    }
    if (st == LK_OK) {
        int gb = dout->dtype == LK_BF16, wb = dweight->dtype == LK_BF16;
        if (gb && wb) launch_segments<lk_bf16_t, lk_bf16_t>(k[2], k[3], T_, H, dout, dweight, s);
        else if (gb) launch_segments<lk_bf16_t, float>(k[2], k[3], T_, H, dout, dweight, s);
        else if (wb) launch_segments<float, lk_bf16_t>(k[2], k[3], T_, H, dout, dweight, s);
        else launch_segments<float, float>(k[2], k[3], T_, H, dout, dweight, s);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = lk_cuda_fail(e, "embedding backward (cuda): segment sums", __FILE__, __LINE__);
    }
    lk_ctx_workspace_end(ctx, mark);
    return st;
}

extern "C" lk_status lk_cuda_embedding_backward(const lk_tensor *dout, const lk_tensor *ids, lk_tensor *dweight,
                                                lk_ctx *ctx) {
    return backward(dout, ids, dweight, ctx, 1);
}

extern "C" lk_status lk_cuda_embedding_backward_unchecked(const lk_tensor *dout, const lk_tensor *ids,
                                                          lk_tensor *dweight, lk_ctx *ctx) {
    return backward(dout, ids, dweight, ctx, 0);
}
