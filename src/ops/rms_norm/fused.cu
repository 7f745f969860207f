/* fused.cu — `fused` RMSNorm on CUDA: one pass over memory each way, f32 math, f32 or
 * bf16 storage.
 *
 * Both passes run as many blocks as fit on the GPU at once, each walking rows with the
 * row held in registers as loaded (16-byte accesses), the NEXT row's loads issued before
 * this row's block reduction and the row after that asked into L2 (one bulk prefetch on
 * Hopper), so every block always has bytes on the way in. On the H200 at 65536x4096
 * bf16: one short-lived block per row moved 74% of the copy rate forward and 66%
 * forward+backward; with the next row in registers 80% and 84%; with the L2 prefetch
 * too 84-87% and 89-90% (runs 3-5: forward 82-84% at the 256-thread default).
 * The forward now takes one warp per row (fwd_warp) when a row fits 16 accesses a lane
 * (4096 bf16, 2048 f32): no block barrier, many short-lived warps in flight; the block
 * kernels remain for longer rows and for the backward. Rows of 2-32 accesses (a head's
 * q_norm / k_norm) take a group of lanes a row both ways (fwd_short, bwd_short).
 * x, y, dy and dx may be views (rows.h): each kernel finds a row with lk_row_at.
 * Forward: the row's sum of squares, y from the registers; rstd saved as f32 [rows].
 * Backward: Σ g·x reduced over the block, then dx written and the thread's columns of
 * dy·x̂ added into registers; each block leaves one f32 partial row of dweight in the
 * workspace, and a column sum (common.cuh) adds the parts in a fixed order and
 * rounds once, so a run is deterministic. Rows too long for registers (or unaligned, or
 * of odd length) take the looped kernels, which read the row twice (the second time
 * from cache).
 *
 * The residual mode (rms_norm.h; the f32 stream of bf16 training, issue 17) is a flag
 * of the same kernels (RES = RES_F32): the forward makes the row it would have loaded — residual
 * += delta in f32, x = its rounding, stored, and held as loaded — and normalizes the f32
 * stream: the sum of squares of the f32 sums as they are made, and y from the f32
 * residual read back (this thread's own stores, from L1/L2: 4 bytes an element more,
 * not measured yet) rather than from registers, which hold x as T. With norm_of_x it
 * normalizes the held x instead: the sum of squares, rstd and y are then the plain
 * kernel's on that x, bit for bit (a recompute runs the plain one). The block kernel
 * drops its next-row double buffer there (the next row's x does not exist yet). The
 * backward reads x and rstd as the plain one does, and adds its f32 dx into the residual
 * before the rounding store. The adds are __fadd_rn: never contracted into the multiply before them, so in
 * f32 they are the separate adds of before. The f32 residual is read 16 bytes at a time
 * (two accesses per bf16 group). The stream in x's dtype (RES_X: a bf16 residual,
 * rms_norm.h) is the same kernels with the residual loaded as T and never stored: x is
 * the stream, normalized as norm_of_x normalizes it; dx = the rounding of residual + dx.
 *
 * An f32 weight beside bf16 x (rms_norm.h; issue 17's parity: autocast multiplies by the
 * f32 weight) is a type parameter TW of every kernel: the weights load as f32 (two
 * 16-byte loads per bf16 group), the math was f32 already, y is rounded once, and the
 * column sum stores dweight's f32 sums as they are.
 *
 * RoPE after the norm (rms_norm.h's rope; Qwen3's q_norm / k_norm and then its rotary
 * embedding, one pass over q and k each way where two were) is a flag of the short
 * kernels (ROPE): a lane's partner dims are one shuffle away when a row's accesses are a
 * power of two, and the rotation is rope/rotate.cuh's, the `fused` RoPE's own, so y, dx and
 * dweight are the bits of this norm and then that RoPE. Other rows (not 16-byte accesses,
 * or a count of them not a power of two, or too long for the short kernels) are refused
 * with the option named, before anything runs. On the MoE step (H100, ncu, bench/NOTES.md
 * thirty-eighth session) the norms with RoPE took 5.28 ms where the norms and the RoPE kernel
 * took 6.75 (fwd_short 34 -> 47 us a call, bwd_short 59 -> 71, 48 RoPE calls of 56 us gone).
 *
 * Reached through lk_rms_norm_forward / _backward (rms_norm.c), which validated every
 * argument; the workspace comes from ctx->arena (a device arena). */
#include "common.cuh"
#include "llmkern/registry.h"
#include "ops/rope/rotate.cuh"
#include "ops/rows.h"
#include <type_traits>

#define MAX_VPT 8           /* 16-byte groups per thread held in registers */
/* Threads a row of the block kernels aims at (rounded by plan_of). At 65536x4096 bf16 on
 * the H200 (one run, the same binary): 64: fwd 3662 GB/s, fwd+bwd 3266; 128: 3547, 3798;
 * 256: 3664, 3751; 512: 3506, 3536. The forward of such rows now takes fwd_warp, one warp
 * a row: 88.6-88.9% of copy against the block kernels' 83.0-84.0% (run 6). */
#define TARGET_THREADS 256
#define WARP_ROWS 4          /* rows (warps) per block of fwd_warp */
#define WARP_VPT 16          /* the most accesses a lane holds: 4096 bf16 (8 KiB) a row */
#define BWD_BLOCKS_PER_SM 8
/* Rows of at most SHORT_ROW elements (a head's q_norm / k_norm: 128) make blocks of one or
 * two warps: at 8 a SM the backward had 8-16 warps a SM in flight and moved ~1.2 TB/s in
 * a 0.6B model's step (22.7 of its 420 ms, bench/NOTES.md); up to 32 such blocks a SM
 * (the occupancy query caps it), each a partial row of dweight more (n floats). */
#define SHORT_ROW 512
#define BWD_BLOCKS_PER_SM_SHORT 32
#define LOOP_THREADS 256

typedef struct {
    int w;          /* elements per access: lk_vec<T>::N, or 1 */
    int vpt;        /* accesses per thread held in registers; 0 = looped kernels */
    int threads;
} plan;

static int round32(int64_t v) { return (int)((v + 31) / 32 * 32); }

/* Threads a block of the register kernels may have: deeper rows per thread need more
 * registers, and the register file caps threads x registers (8 deep: 255 registers). */
#define REG_THREADS(vpt) ((vpt) >= 8 ? 256 : (vpt) >= 4 ? 512 : 1024)

/* The register path when the row fits in REG_THREADS x MAX_VPT accesses; 16-byte
 * accesses when the row length and every pointer allow them. */
static plan plan_of(int64_t n, lk_dtype dt, const void *const *ptrs, int nptr, const lk_tensor *const *views,
                    int nview) {
    int vw = dt == LK_F32 ? 4 : 8, aligned = n % vw == 0;
    for (int i = 0; i < nptr; i++) aligned &= ptrs[i] == NULL || lk_aligned16(ptrs[i]);
    for (int i = 0; i < nview; i++) {   /* every row of a view 16-byte aligned too */
        lk_rows m = {1, 0, 0};
        lk_rows_of(views[i], &m);
        aligned &= m.outer % vw == 0 && m.step % vw == 0;
    }
    plan p = {aligned ? vw : 1, 0, LOOP_THREADS};
    int64_t units = n / p.w;
    if (p.w == 1) {                               /* odd rows: one width, MAX_VPT deep */
        if (units <= REG_THREADS(MAX_VPT) * MAX_VPT) p.vpt = MAX_VPT, p.threads = round32(lk_cdiv(units, MAX_VPT));
        return p;
    }
    int vpt = 1;
    while (vpt < MAX_VPT && units > (int64_t)TARGET_THREADS * vpt) vpt *= 2;
    if (lk_cdiv(units, vpt) <= REG_THREADS(vpt)) p.vpt = vpt, p.threads = round32(lk_cdiv(units, vpt));
    return p;
}

/* Grid: as many blocks as fit on the GPU at once (at most cap); each walks rows. */
template <typename K>
static lk_status fit_grid(K kernel, int threads, int64_t cap, int64_t *grid) {
    int per_sm = 0;
    LK_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    int64_t fit = (int64_t)(per_sm > 0 ? per_sm : 1) * (lk_hw_get()->cuda_sms > 0 ? lk_hw_get()->cuda_sms : 1);
    *grid = fit < cap ? fit : cap;
    return LK_OK;
}

/* Row r of src into registers, as loaded: unit u = threadIdx.x + k·blockDim.x. */
template <typename T, int W, int VPT>
static __device__ __forceinline__ void load_row(const T *src, int units, lk_pack<T, W> *v) {
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int u = threadIdx.x + k * blockDim.x;
        if (u < units) lk_ldp<T, W>(src + u * W, v[k]);
    }
}

/* Row `row` of src brought toward L2 two rows ahead of its loads (16-byte path only). */
template <typename T, int W, int VPT>
static __device__ __forceinline__ void prefetch_row(const T *src, int n, int units) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (W == lk_vec<T>::N && threadIdx.x == 0) lk_prefetch_l2_bulk(src, (unsigned)(n * sizeof(T)));
#else
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int u = threadIdx.x + k * blockDim.x;
        if (W == lk_vec<T>::N && u < units && (u * W * sizeof(T)) % 128 == 0) lk_prefetch_l2(src + u * W);
    }
#endif
}

/* W floats at p into f (16-byte accesses when W is a multiple of 4: the residual's
 * groups, aligned when the row's 16-byte path is), and back. */
template <int W>
static __device__ __forceinline__ void ld_f32(const float *p, float *f) {
    if (W % 4 == 0) {
#pragma unroll
        for (int q = 0; q < W / 4; q++) {
            float4 v = reinterpret_cast<const float4 *>(p)[q];
            f[4 * q] = v.x, f[4 * q + 1] = v.y, f[4 * q + 2] = v.z, f[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = p[j];
    }
}
template <int W>
static __device__ __forceinline__ void st_f32(float *p, const float *f) {
    if (W % 4 == 0) {
#pragma unroll
        for (int q = 0; q < W / 4; q++)
            reinterpret_cast<float4 *>(p)[q] = make_float4(f[4 * q], f[4 * q + 1], f[4 * q + 2], f[4 * q + 3]);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) p[j] = f[j];
    }
}

/* The residual mode's pointers, NULL when off; of_x: norm_of_x (rms_norm.h), set too for
 * the stream in x's dtype (RES_X: the residual is T, read only, and x is the stream). */
enum { RES_OFF, RES_F32, RES_X };
typedef struct {
    void *res;
    const void *delta;
    void *x;
    int of_x;
} res_args;

static int res_mode(const lk_rms_norm_args *a) {
    return !a->residual.data ? RES_OFF : a->residual.dtype == LK_F32 ? RES_F32 : RES_X;
}

/* The residual mode's forward for the access at element e: res += delta (NULL: nothing),
 * then x = its rounding, stored and held in v as the plain kernel would have loaded it; ss
 * (NULL: norm_of_x) takes the squares of the f32 sums, the stream's. RES_X reads the
 * residual as T and stores only x. */
template <typename T, int W, int RES>
static __device__ __forceinline__ void residual_in(const res_args &ra, int64_t e, lk_pack<T, W> &v, float *ss) {
    float r[W];
    if constexpr (RES == RES_F32) ld_f32<W>((const float *)ra.res + e, r);
    else lk_ldw<T, W>((const T *)ra.res + e, r);
    if (ra.delta) {
        float d[W];
        lk_ldw<T, W>((const T *)ra.delta + e, d);
#pragma unroll
        for (int j = 0; j < W; j++) r[j] = __fadd_rn(r[j], d[j]);
        if constexpr (RES == RES_F32) st_f32<W>((float *)ra.res + e, r);
    }
    if (ss)
#pragma unroll
        for (int j = 0; j < W; j++) *ss = fmaf(r[j], r[j], *ss);
#pragma unroll
    for (int j = 0; j < W; j++) v.e[j] = lk_from_f32<T>(r[j]);
    T *x = (T *)ra.x + e;
    if (W == lk_vec<T>::N) *reinterpret_cast<uint4 *>(x) = *reinterpret_cast<const uint4 *>(v.e);
    else
#pragma unroll
        for (int j = 0; j < W; j++) x[j] = v.e[j];
}

/* ... and the backward's: res += o (the f32 dx), dx = its rounding. RES_X reads the
 * residual (which may be dx) as T and stores only dx. */
template <typename T, int W, int RES>
static __device__ __forceinline__ void residual_out(void *res, int64_t e, const float *o, T *dx) {
    float r[W];
    if constexpr (RES == RES_F32) ld_f32<W>((const float *)res + e, r);
    else lk_ldw<T, W>((const T *)res + e, r);
#pragma unroll
    for (int j = 0; j < W; j++) r[j] = __fadd_rn(r[j], o[j]);
    if constexpr (RES == RES_F32) st_f32<W>((float *)res + e, r);
    lk_stw<T, W>(dx, r);
}

/* W weights at p into f: of x's type T (then as the rows' 16-byte or scalar accesses), or
 * f32 beside bf16 x (rms_norm.h: bf16 training's master weight; W = 8: two 16-byte
 * loads, aligned when the row's 16-byte path is). Read through the read-only cache:
 * every row of the block reads the same weights. */
template <typename T, typename TW, int W>
static __device__ __forceinline__ void ld_weight(const TW *p, float *f) {
    if constexpr (std::is_same<TW, T>::value) {
        lk_ldw<T, W>(p, f, false);
    } else if constexpr (W % 4 == 0) {
#pragma unroll
        for (int q = 0; q < W / 4; q++) {
            float4 v = __ldg(reinterpret_cast<const float4 *>(p) + q);
            f[4 * q] = v.x, f[4 * q + 1] = v.y, f[4 * q + 2] = v.z, f[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = __ldg(p + j);
    }
}

/* Where each tensor's rows lie (rows.h): views of x, y, dy, dx; in the residual mode
 * contiguous (inner 1, outer n), where the stream's pointers keep row · n. */
typedef struct {
    lk_rows x, y;
} fwd_rows;
typedef struct {
    lk_rows x, dy, dx;
} bwd_rows;

/* The residual mode's W elements of the row the forward normalizes, into f: the f32
 * stream at res (which this thread stored or read), or with norm_of_x (and RES_X) the
 * held x. */
template <typename T, int W, int RES>
static __device__ __forceinline__ void norm_in(const lk_pack<T, W> &v, const res_args &ra, int64_t e, float *f) {
    if (RES == RES_F32 && !ra.of_x) {
        ld_f32<W>((const float *)ra.res + e, f);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = v.f(j);
    }
}


/* ---- forward ------------------------------------------------------------------ */

/* Blocks walk rows r = blockIdx.x, + gridDim.x, ...; the next row's loads are issued
 * before this row's reduction, so every block always has a row on its way in. */
template <typename T, typename TW, int W, int VPT, int RES>
__global__ void __launch_bounds__(REG_THREADS(VPT)) fwd_reg(const T *__restrict__ x, const TW *__restrict__ w,
                                                           T *__restrict__ y, float *__restrict__ rstd,
                                                           int64_t rows, int n, float eps, float off, res_args ra,
                                                           fwd_rows rw) {
    __shared__ float scratch[32];
    const int units = n / W;
    lk_pack<T, W> cur[VPT], nxt[VPT];
    if (!RES) load_row<T, W, VPT>(x + lk_row_at(rw.x, blockIdx.x), units, cur);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float ss = 0.0f;   /* RES: the stream's squares (norm_of_x: x's, below) */
        if (RES) {
#pragma unroll
            for (int k = 0; k < VPT; k++) {
                int u = threadIdx.x + k * blockDim.x;
                if (u < units)
                    residual_in<T, W, RES>(ra, row * n + u * W, cur[k], ra.of_x ? NULL : &ss);
            }
        } else {
            if (row + gridDim.x < rows) load_row<T, W, VPT>(x + lk_row_at(rw.x, row + gridDim.x), units, nxt);
            if (row + 2 * gridDim.x < rows) prefetch_row<T, W, VPT>(x + lk_row_at(rw.x, row + 2 * gridDim.x), n, units);
        }
        if (!RES || ra.of_x)
#pragma unroll
            for (int k = 0; k < VPT; k++)
                if (threadIdx.x + k * blockDim.x < units)
#pragma unroll
                    for (int j = 0; j < W; j++) ss = fmaf(cur[k].f(j), cur[k].f(j), ss);
        const float rs = rsqrtf(lk_block_sum(ss, scratch) / (float)n + eps);
        if (threadIdx.x == 0) rstd[row] = rs;
        T *yr = y + lk_row_at(rw.y, row);
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            int u = threadIdx.x + k * blockDim.x;
            if (u < units) {
                float o[W], wv[W];
                if (w) ld_weight<T, TW, W>(w + u * W, wv);
                if constexpr (RES != RES_OFF) {   /* the f32 stream this thread stored or read, or x */
                    float xs[W];
                    norm_in<T, W, RES>(cur[k], ra, row * n + u * W, xs);
#pragma unroll
                    for (int j = 0; j < W; j++) o[j] = xs[j] * rs * (w ? wv[j] + off : 1.0f);
                } else {
#pragma unroll
                    for (int j = 0; j < W; j++) o[j] = cur[k].f(j) * rs * (w ? wv[j] + off : 1.0f);
                }
                lk_stw<T, W>(yr + u * W, o);
            }
            if (!RES) cur[k] = nxt[k];
        }
    }
}

/* One warp per row, WARP_ROWS rows a block, one row a warp and then it exits: the row is
 * loaded whole (VPT 16-byte accesses a lane, all in flight at once), summed with shuffles
 * alone (no shared memory, no barrier), and y written from the registers. Latency is
 * hidden by the many short-lived warps an SM holds (at ~90 registers, ~20 rows of 8 KiB
 * in flight an SM), the way the SwiGLU kernel's one-group threads reach the copy rate,
 * instead of by the block kernels' next-row double buffer. Rows need not fill a block. */
template <typename T, typename TW, int W, int VPT, int RES>
__global__ void __launch_bounds__(WARP_ROWS * 32) fwd_warp(const T *__restrict__ x, const TW *__restrict__ w,
                                                          T *__restrict__ y, float *__restrict__ rstd, int64_t rows,
                                                          int n, float eps, float off, res_args ra, fwd_rows rw) {
    const int lane = threadIdx.x & 31, units = n / W;
    const int64_t row = (int64_t)blockIdx.x * WARP_ROWS + (threadIdx.x >> 5);
    if (row >= rows) return;   /* the whole warp: the shuffles below see every lane */
    const T *xr = x + lk_row_at(rw.x, row);
    lk_pack<T, W> v[VPT];
    float ss = 0.0f;   /* RES: the stream's squares (norm_of_x: x's, below) */
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int64_t e = row * n + (lane + 32 * k) * W;
        if (lane + 32 * k < units) {
            if (RES)
                residual_in<T, W, RES>(ra, e, v[k], ra.of_x ? NULL : &ss);
            else lk_ldp<T, W>(xr + (lane + 32 * k) * W, v[k]);
        }
    }
    if (!RES || ra.of_x)
#pragma unroll
        for (int k = 0; k < VPT; k++)
            if (lane + 32 * k < units)
#pragma unroll
                for (int j = 0; j < W; j++) ss = fmaf(v[k].f(j), v[k].f(j), ss);
    const float rs = rsqrtf(lk_warp_sum(ss) / (float)n + eps);
    if (lane == 0) rstd[row] = rs;
    T *yr = y + lk_row_at(rw.y, row);
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int u = lane + 32 * k;
        if (u < units) {
            float o[W], wv[W];
            if (w) ld_weight<T, TW, W>(w + u * W, wv);
            if constexpr (RES != RES_OFF) {   /* the f32 stream this thread stored or read, or x */
                float xs[W];
                norm_in<T, W, RES>(v[k], ra, row * n + u * W, xs);
#pragma unroll
                for (int j = 0; j < W; j++) o[j] = xs[j] * rs * (w ? wv[j] + off : 1.0f);
            } else {
#pragma unroll
                for (int j = 0; j < W; j++) o[j] = v[k].f(j) * rs * (w ? wv[j] + off : 1.0f);
            }
            lk_stw<T, W>(yr + u * W, o);
        }
    }
}

/* fwd_warp when a row is 2 .. WARP_VPT accesses a lane; *taken says whether it ran. */
typedef struct {
    const void *x, *w;
    void *y;
    float *rstd;
    res_args ra;
    fwd_rows m;
} fwd_ptrs;

template <typename T, typename TW, int W, int RES>
static void run_fwd_warp(int vpt, unsigned grid, cudaStream_t st, const fwd_ptrs &p, int64_t rows, int n, float eps,
                         float off) {
    void (*k)(const T *, const TW *, T *, float *, int64_t, int, float, float, res_args, fwd_rows) =
        vpt == 2   ? fwd_warp<T, TW, W, 2, RES>
        : vpt == 4 ? fwd_warp<T, TW, W, 4, RES>
        : vpt == 8 ? fwd_warp<T, TW, W, 8, RES>
                   : fwd_warp<T, TW, W, 16, RES>;
    k<<<grid, WARP_ROWS * 32, 0, st>>>((const T *)p.x, (const TW *)p.w, (T *)p.y, p.rstd, rows, n, eps, off, p.ra,
                                       p.m);
}

static fwd_ptrs fwd_ptrs_of(const lk_rms_norm_args *a) {
    fwd_ptrs p = {a->x.data, a->weight.data, a->y.data, (float *)a->saved.data,
                  {a->residual.data, a->delta.data, a->x.data, a->norm_of_x || res_mode(a) == RES_X}, {}};
    lk_rows_of(&a->x, &p.m.x), lk_rows_of(&a->y, &p.m.y);   /* the facade checked both fold */
    return p;
}

template <typename T, typename TW, int W>
static lk_status launch_fwd_warp(const lk_rms_norm_args *a, int64_t rows, int n, cudaStream_t st, int *taken) {
    int units = n / W, per = (int)lk_cdiv(units, 32), vpt = 2;
    *taken = 0;
    if (per < 2 || per > WARP_VPT || rows == 0) return LK_OK;
    while (vpt < per) vpt *= 2;
    fwd_ptrs p = fwd_ptrs_of(a);
    unsigned grid = (unsigned)lk_cdiv(rows, WARP_ROWS);
    switch (res_mode(a)) {
    case RES_OFF: run_fwd_warp<T, TW, W, RES_OFF>(vpt, grid, st, p, rows, n, (float)a->eps, a->weight_offset); break;
    case RES_F32: run_fwd_warp<T, TW, W, RES_F32>(vpt, grid, st, p, rows, n, (float)a->eps, a->weight_offset); break;
    default: run_fwd_warp<T, TW, W, RES_X>(vpt, grid, st, p, rows, n, (float)a->eps, a->weight_offset); break;
    }
    LK_CUDA_LAUNCHED("rms_norm: fused (cuda) forward, a warp a row");
    *taken = 1;
    return LK_OK;
}

/* Any row length: the row is read twice, the second time from L1/L2. */
template <typename T, typename TW, int RES>
__global__ void fwd_loop(const T *__restrict__ x, const TW *__restrict__ w, T *__restrict__ y,
                         float *__restrict__ rstd, int64_t rows, int n, float eps, float off, res_args ra,
                         fwd_rows rw) {
    __shared__ float scratch[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *xr = RES ? (const T *)ra.x + row * n : x + lk_row_at(rw.x, row);   /* RES: read back what this thread wrote */
        T *yr = y + lk_row_at(rw.y, row);
        float ss = 0.0f;
        for (int c = threadIdx.x; c < n; c += blockDim.x) {
            if constexpr (RES != RES_OFF) {
                float r = RES == RES_F32 ? ((const float *)ra.res)[row * n + c] : lk_to_f32(((const T *)ra.res)[row * n + c]);
                if (ra.delta) {
                    r = __fadd_rn(r, lk_to_f32(((const T *)ra.delta)[row * n + c]));
                    if (RES == RES_F32) ((float *)ra.res)[row * n + c] = r;
                }
                ((T *)ra.x)[row * n + c] = lk_from_f32<T>(r);
            }
            float v = RES == RES_F32 && !ra.of_x ? ((const float *)ra.res)[row * n + c] : lk_to_f32(xr[c]);   /* the stream, or x */
            ss = fmaf(v, v, ss);
        }
        const float rs = rsqrtf(lk_block_sum(ss, scratch) / (float)n + eps);
        if (threadIdx.x == 0) rstd[row] = rs;
        for (int c = threadIdx.x; c < n; c += blockDim.x) {
            float v = RES == RES_F32 && !ra.of_x ? ((const float *)ra.res)[row * n + c] : lk_to_f32(xr[c]);
            yr[c] = lk_from_f32<T>(v * rs * (w ? lk_to_f32(w[c]) + off : 1.0f));
        }
    }
}

template <typename T, typename TW, int W, int RES>
static lk_status run_fwd(const plan *p, const lk_rms_norm_args *a, int64_t rows, int n, cudaStream_t st) {
    void (*k)(const T *, const TW *, T *, float *, int64_t, int, float, float, res_args, fwd_rows);
    switch (p->vpt) {
    case 1: k = fwd_reg<T, TW, W, 1, RES>; break;
    case 2: k = fwd_reg<T, TW, W, 2, RES>; break;
    case 4: k = fwd_reg<T, TW, W, 4, RES>; break;
    case 8: k = fwd_reg<T, TW, W, 8, RES>; break;
    default: k = fwd_loop<T, TW, RES>; break;
    }
    int64_t grid;
    lk_status s = fit_grid(k, p->threads, rows, &grid);
    if (s) return s;
    fwd_ptrs q = fwd_ptrs_of(a);
    k<<<(unsigned)grid, p->threads, 0, st>>>((const T *)q.x, (const TW *)q.w, (T *)q.y, q.rstd, rows, n, (float)a->eps,
                                             a->weight_offset, q.ra, q.m);
    return LK_OK;
}

template <typename T, typename TW, int W>
static lk_status launch_fwd(const plan *p, const lk_rms_norm_args *a, int64_t rows, int n, cudaStream_t st) {
    const int mode = res_mode(a);
    lk_status s = mode == RES_F32 ? run_fwd<T, TW, W, RES_F32>(p, a, rows, n, st)
                  : mode == RES_X ? run_fwd<T, TW, W, RES_X>(p, a, rows, n, st)
                                  : run_fwd<T, TW, W, RES_OFF>(p, a, rows, n, st);
    if (s) return s;
    LK_CUDA_LAUNCHED("rms_norm: fused (cuda) forward");
    return LK_OK;
}

/* ---- backward ----------------------------------------------------------------- */

/* dx = rs·(g − x̂·m), g = dy·(off + w), x̂ = x·rs, m = mean(g·x̂); partial[block] = Σ dy·x̂
 * over the block's rows, in registers until the end. Rows are walked as in the forward,
 * the next row's x and dy loaded before this row's reduction. Element j of dy is read
 * before dx's element j is written by the same thread, so dx may be dy. */
template <typename T, typename TW, int W, int VPT, int RES>
__global__ void __launch_bounds__(REG_THREADS(VPT)) bwd_reg(const T *__restrict__ x, const TW *__restrict__ w,
                                                           const T *dy,
                                                           T *dx, const float *__restrict__ rstd,
                                                           float *__restrict__ partial, int64_t rows, int n,
                                                           float off, void *__restrict__ res, bwd_rows rw) {
    __shared__ float scratch[32];
    const int units = n / W;
    float acc[VPT][W];
#pragma unroll
    for (int k = 0; k < VPT; k++)
#pragma unroll
        for (int j = 0; j < W; j++) acc[k][j] = 0.0f;
    lk_pack<T, W> xc[VPT], dc[VPT], xn[VPT], dn[VPT];
    load_row<T, W, VPT>(x + lk_row_at(rw.x, blockIdx.x), units, xc);
    load_row<T, W, VPT>(dy + lk_row_at(rw.dy, blockIdx.x), units, dc);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        if (row + gridDim.x < rows) {
            load_row<T, W, VPT>(x + lk_row_at(rw.x, row + gridDim.x), units, xn);
            load_row<T, W, VPT>(dy + lk_row_at(rw.dy, row + gridDim.x), units, dn);
        }
        if (row + 2 * gridDim.x < rows) {
            prefetch_row<T, W, VPT>(x + lk_row_at(rw.x, row + 2 * gridDim.x), n, units);
            prefetch_row<T, W, VPT>(dy + lk_row_at(rw.dy, row + 2 * gridDim.x), n, units);
        }
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            int u = threadIdx.x + k * blockDim.x;
            if (u < units) {
                float wv[W];
                if (w) ld_weight<T, TW, W>(w + u * W, wv);
#pragma unroll
                for (int j = 0; j < W; j++) dot = fmaf(dc[k].f(j) * (w ? wv[j] + off : 1.0f), xc[k].f(j), dot);
            }
        }
        const float rs = rstd[row];
        const float m = lk_block_sum(dot, scratch) * rs / (float)n;
        T *dxr = dx + lk_row_at(rw.dx, row);
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            int u = threadIdx.x + k * blockDim.x;
            if (u < units) {
                float wv[W], o[W];
                if (w) ld_weight<T, TW, W>(w + u * W, wv);
#pragma unroll
                for (int j = 0; j < W; j++) {
                    float d = dc[k].f(j), xh = xc[k].f(j) * rs, g = d * (w ? wv[j] + off : 1.0f);
                    acc[k][j] = fmaf(d, xh, acc[k][j]);
                    o[j] = rs * (g - xh * m);
                }
                if (RES != RES_OFF) residual_out<T, W, RES>(res, row * n + u * W, o, dxr + u * W);
                else lk_stw<T, W>(dxr + u * W, o);
            }
            xc[k] = xn[k];
            dc[k] = dn[k];
        }
    }
    if (partial == NULL) return;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int u = threadIdx.x + k * blockDim.x;
        if (u < units)
#pragma unroll
            for (int j = 0; j < W; j++) partial[(int64_t)blockIdx.x * n + u * W + j] = acc[k][j];
    }
}

/* Any row length: each thread owns columns c ≡ threadIdx.x and adds into its block's
 * partial row in place. */
template <typename T, typename TW, int RES>
__global__ void bwd_loop(const T *__restrict__ x, const TW *__restrict__ w, const T *dy, T *dx,
                         const float *__restrict__ rstd, float *__restrict__ partial, int64_t rows, int n,
                         float off, void *__restrict__ res, bwd_rows rw) {
    __shared__ float scratch[32];
    float *pp = partial ? partial + (int64_t)blockIdx.x * n : NULL;
    if (pp)
        for (int c = threadIdx.x; c < n; c += blockDim.x) pp[c] = 0.0f;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *xr = x + lk_row_at(rw.x, row), *dyr = dy + lk_row_at(rw.dy, row);
        T *dxr = dx + lk_row_at(rw.dx, row);
        float dot = 0.0f;
        for (int c = threadIdx.x; c < n; c += blockDim.x)
            dot = fmaf(lk_to_f32(dyr[c]) * (w ? lk_to_f32(w[c]) + off : 1.0f), lk_to_f32(xr[c]), dot);
        const float rs = rstd[row];
        const float m = lk_block_sum(dot, scratch) * rs / (float)n;
        for (int c = threadIdx.x; c < n; c += blockDim.x) {
            float d = lk_to_f32(dyr[c]), xh = lk_to_f32(xr[c]) * rs;
            float g = d * (w ? lk_to_f32(w[c]) + off : 1.0f);
            if (pp) pp[c] = fmaf(d, xh, pp[c]);
            float o = rs * (g - xh * m);
            if constexpr (RES == RES_F32) o = ((float *)res)[row * n + c] = __fadd_rn(((float *)res)[row * n + c], o);
            if constexpr (RES == RES_X) o = __fadd_rn(lk_to_f32(((const T *)res)[row * n + c]), o);
            dxr[c] = lk_from_f32<T>(o);
        }
    }
}

/* Launches the backward on as many blocks as fit on the GPU at once (at most max_parts,
 * what the workspace holds) and says how many in *parts. */
template <typename T, typename TW, int W, int RES>
static lk_status run_bwd(const plan *p, const lk_rms_norm_args *a, float *partial, int64_t max_parts,
                         int64_t rows, int n, cudaStream_t st, int64_t *parts) {
    void (*k)(const T *, const TW *, const T *, T *, const float *, float *, int64_t, int, float, void *, bwd_rows);
    switch (p->vpt) {
    case 1: k = bwd_reg<T, TW, W, 1, RES>; break;
    case 2: k = bwd_reg<T, TW, W, 2, RES>; break;
    case 4: k = bwd_reg<T, TW, W, 4, RES>; break;
    case 8: k = bwd_reg<T, TW, W, 8, RES>; break;
    default: k = bwd_loop<T, TW, RES>; break;
    }
    lk_status s = fit_grid(k, p->threads, max_parts, parts);
    if (s) return s;
    bwd_rows rw;
    lk_rows_of(&a->x, &rw.x), lk_rows_of(&a->dy, &rw.dy), lk_rows_of(&a->dx, &rw.dx);   /* the facade checked them */
    k<<<(unsigned)*parts, p->threads, 0, st>>>((const T *)a->x.data, (const TW *)a->weight.data,
                                              (const T *)a->dy.data, (T *)a->dx.data, (const float *)a->saved.data,
                                              partial, rows, n, a->weight_offset, a->residual.data, rw);
    LK_CUDA_LAUNCHED("rms_norm: fused (cuda) backward");
    return LK_OK;
}

template <typename T, typename TW, int W>
static lk_status launch_bwd(const plan *p, const lk_rms_norm_args *a, float *partial, int64_t max_parts,
                            int64_t rows, int n, cudaStream_t st, int64_t *parts) {
    const int mode = res_mode(a);
    return mode == RES_F32 ? run_bwd<T, TW, W, RES_F32>(p, a, partial, max_parts, rows, n, st, parts)
           : mode == RES_X ? run_bwd<T, TW, W, RES_X>(p, a, partial, max_parts, rows, n, st, parts)
                           : run_bwd<T, TW, W, RES_OFF>(p, a, partial, max_parts, rows, n, st, parts);
}

/* ---- short rows: a group of lanes a row ------------------------------------------ */

/* Rows of 2-32 accesses of 16 bytes (a head's q_norm / k_norm: 128 bf16, 16 accesses)
 * take G lanes a row (G the power of two at or above the row's accesses), 32 / G rows a
 * warp at once and SR such sets a warp: every load of a warp's rows issued before any is
 * used, the sums by shuffles within the group, no shared memory and no barrier in the row
 * loop. The block kernels ran such rows one at a time a block (a warp of 16 busy lanes):
 * latency-bound at ~1.2 TB/s, and on the views of q_norm / k_norm (rows.h) slower still:
 * at the 0.6B dense config a forward took 178 us a call, 69 us here (q and k: ~2.8 TB/s),
 * the backward 108 us (bench/NOTES.md, eighteenth session). The forward's warps are
 * short-lived; the backward's blocks walk row sets (a persistent grid, what the dweight
 * workspace holds) and sum their lanes' dweight columns in shared memory at the end, in a
 * fixed order. The backward reads each row's rstd with the row's loads: after the group
 * sum it was one more round trip a row set.
 *
 * RoPE after the norm (ROPE; rms_norm.h's rope, x [T, H, n], row r of token r / H): when
 * the row's accesses are a power of two (units == G) lane g holds dims [g·W, g·W + W) and
 * the other halves of their rotate-half pairs (j ± n/2) are in lane g ^ G/2, one shuffle
 * away (four 32-bit words a lane). The forward rounds y to T, rotates the rounded values
 * (rope/rotate.cuh, the `fused` RoPE's formula) and rounds again: that RoPE's bits after
 * this norm's. The backward rotates dy back, rounds it to T (as that RoPE's backward
 * stores it) and runs the norm's backward on it. Each row's position id is read with the
 * row's loads (its angles' loads wait on it); the angles (W cos, W sin a lane: 16-byte
 * loads where the tables are aligned) as a set begins, from L2, before its group sum, and
 * only for a row at another position than the row before (a set's rows are one token's
 * heads unless it crosses a token).
 * These kernels are bound by their instructions, not by HBM (ncu: 6-7 cycles an issued
 * instruction with ~5 warps a scheduler, DRAM at 44-50%): a set finds its rows by one
 * division and steps (rows_at) where each row divided three times, and the angles load once
 * a set. In the 0.6B dense step (H100, bench/NOTES.md, fifty-fourth session) fwd_short went
 * 106.6 -> 95.1 us a call and bwd_short 157.4 -> 135.5; with the split shared by every view
 * of one inner count (split_rows: x, y or dy, dx and the position ids of the q and k norms)
 * 95.8 -> 91.5 and 135.2 -> 126.0 (fifty-sixth session). Holding the next set's loads in
 * registers while this one is formed was slower (+6%, +17%: the registers cost warps).
 * With ROPE a row is all G lanes (n = G·W, a power of two known at compile time), so its
 * mean divides by a constant: a multiply, the same bits, where a run-time n took the IEEE
 * division's ~10 instructions a row (fifty-eighth session: fwd_short 90.4 -> 88.2 us a
 * call, bwd_short level).
 * Registers (ptxas -v, sm_90a, bf16): fwd_short 66-72 (ROPE 79-80: 6 blocks an SM),
 * bwd_short 103-105 (ROPE 127-128: 4 blocks an SM, the grid both take: launch_bwd_short);
 * f32 48-54 (63-72), 92-96 (96-105); no spill. */
#define SR 4
#define SHORT_THREADS 128

/* What ROPE reads (host-made, norm_rope_of); unused without it. */
typedef struct {
    const float *cos, *sin;   /* f32 [max_pos, half], contiguous */
    const void *pos;          /* [T], i32 or i64 (pos64) */
    int64_t max_pos;
    int pos64, heads, half;
    int vec;                  /* both tables 16-byte aligned: float4 loads (half is a multiple of 4) */
} norm_rope;

/* The first elements of rows r0 + s·d (s < N) of a view (rows.h): one division for the first
 * and steps for the rest, where lk_row_at divides for each (~20 instructions a row, and the
 * ROPE kernels divide three times a row: x, y or dx, and the token of the position id). */
template <int N>
static __device__ __forceinline__ void rows_at(lk_rows m, int64_t r0, int d, int64_t *off) {
    if (m.inner == 1) {
#pragma unroll
        for (int s = 0; s < N; s++) off[s] = (r0 + s * d) * m.outer;
        return;
    }
    int64_t q, rem;
    if (r0 <= INT32_MAX && m.inner <= INT32_MAX) {
        q = (uint32_t)r0 / (uint32_t)m.inner;
        rem = r0 - q * m.inner;
    } else {
        q = r0 / m.inner, rem = r0 % m.inner;
    }
#pragma unroll
    for (int s = 0; s < N; s++) {
        off[s] = q * m.outer + rem * m.step;
        for (rem += d; rem >= m.inner; rem -= m.inner) q++;
    }
}

/* Rows of [T, heads] whose offset is the token: rows_at of it gives each row's r / heads. */
static __device__ __forceinline__ lk_rows token_rows(const norm_rope &rp) { return lk_rows{rp.heads, 1, 0}; }

/* Rows r0 + s·d (s < N) as (r / inner, r % inner) in 32 bits, once for every view of that
 * inner count (the q and k norms' x, y or dy, dx and the position ids are all [T, heads]):
 * each view's offset is then two multiply-adds, where rows_at steps 64-bit values a view.
 * false where a row index or inner passes 2^31 (rows_at's 64-bit path then). */
template <int N>
static __device__ __forceinline__ bool split_rows(int64_t inner, int64_t r0, int d, uint32_t *q, uint32_t *rem) {
    if (inner > INT32_MAX || r0 + (int64_t)N * d > INT32_MAX) return false;
    if (inner == 1) {
#pragma unroll
        for (int s = 0; s < N; s++) q[s] = (uint32_t)r0 + s * d, rem[s] = 0;
        return true;
    }
    const uint32_t in = (uint32_t)inner;
    uint32_t qq = (uint32_t)r0 / in, rr = (uint32_t)r0 - qq * in;
#pragma unroll
    for (int s = 0; s < N; s++) {
        q[s] = qq, rem[s] = rr;
        for (rr += d; rr >= in; rr -= in) qq++;
    }
    return true;
}

/* The first element of the row at (q, rem) of view m (rows.h). */
static __device__ __forceinline__ int64_t row_of(lk_rows m, uint32_t q, uint32_t rem) {
    return (int64_t)q * m.outer + (int64_t)rem * m.step;
}

/* Token t's position id, read raw (lo, and hi for i64): nothing waits on the load until the
 * angles are read. */
static __device__ __forceinline__ void rope_id_load(const norm_rope &rp, int64_t t, int &lo, int &hi) {
    if (rp.pos64) {
        const int2 v = __ldg(reinterpret_cast<const int2 *>(rp.pos) + t);
        lo = v.x, hi = v.y;
    } else {
        lo = __ldg(reinterpret_cast<const int *>(rp.pos) + t), hi = 0;
    }
}

/* W floats of a table at p, through the read-only cache (every head of a token and every
 * token at that position read them). */
template <int W>
static __device__ __forceinline__ void ld_table(const float *p, bool vec, float *f) {
    if (W % 4 == 0 && vec) {
#pragma unroll
        for (int q = 0; q < W / 4; q++) {
            const float4 v = __ldg(reinterpret_cast<const float4 *>(p) + q);
            f[4 * q] = v.x, f[4 * q + 1] = v.y, f[4 * q + 2] = v.z, f[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = __ldg(p + j);
    }
}

/* Lane g's W angles (cos c, sin s) at the id (lo, hi) (live: a row to rotate): dims
 * (g mod G/2)·W + e of the half. An id outside [0, max_pos) gives NaN, as in the fused
 * RoPE (the ids are device memory the facade does not read). */
template <int W, int G>
static __device__ __forceinline__ void rope_angles(const norm_rope &rp, bool live, int lo, int hi, int g, float *c,
                                                   float *s) {
    const int64_t p = rp.pos64 ? (int64_t)(((uint64_t)(unsigned)hi << 32) | (unsigned)lo) : (int64_t)lo;
    if (live && p >= 0 && p < rp.max_pos) {
        const int64_t o = p * rp.half + (g & (G / 2 - 1)) * W;
        ld_table<W>(rp.cos + o, rp.vec, c);
        ld_table<W>(rp.sin + o, rp.vec, s);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) c[j] = s[j] = __int_as_float(0x7fc00000);   /* NaN */
    }
}

/* Lane g's unit v (rounded to T) rotated by (c, sgn·s) into o: the pairs' other halves
 * from lane g ^ G/2 (the lanes below G/2 hold the first half). Every lane of the warp
 * takes part (the shuffles), live or not. */
template <typename T, int W, int G>
static __device__ __forceinline__ void rope_unit(const lk_pack<T, W> &v, int g, const float *c, const float *s,
                                                 float sgn, float *o) {
    static_assert(sizeof(lk_pack<T, W>) == 16, "a unit is one 16-byte access");
    const uint4 u = *reinterpret_cast<const uint4 *>(v.e);
    uint4 q;
    q.x = __shfl_xor_sync(0xffffffffu, u.x, G / 2), q.y = __shfl_xor_sync(0xffffffffu, u.y, G / 2);
    q.z = __shfl_xor_sync(0xffffffffu, u.z, G / 2), q.w = __shfl_xor_sync(0xffffffffu, u.w, G / 2);
    lk_pack<T, W> other;
    *reinterpret_cast<uint4 *>(other.e) = q;
    const bool first = g < G / 2;
#pragma unroll
    for (int j = 0; j < W; j++) o[j] = lk_rope_rotate_half(v.f(j), other.f(j), c[j], sgn * s[j], first);
}

/* Whether row s of a set needs its own RoPE angles: the first row does, and a later one at
 * another position than the row before (a set's rows are heads of one token unless it
 * crosses a token). A row past the end keeps the angles it has (nothing of it is stored). */
static __device__ __forceinline__ bool new_angles(const int *plo, const int *phi, int s, bool in) {
    return s == 0 || (in && (plo[s] != plo[s - 1] || phi[s] != phi[s - 1]));
}

template <typename T, typename TW, int W, int G, bool ROPE>
__global__ void __launch_bounds__(SHORT_THREADS) fwd_short(const T *__restrict__ x, const TW *__restrict__ w,
                                                           T *__restrict__ y, float *__restrict__ rstd, int64_t rows,
                                                           int n, float eps, float off, fwd_rows rw, norm_rope rp) {
    constexpr int RPW = 32 / G;   /* rows a set */
    const int lane = threadIdx.x & 31, g = lane % G, units = n / W;
    const int64_t base = ((int64_t)blockIdx.x * (SHORT_THREADS / 32) + (threadIdx.x >> 5)) * RPW * SR + lane / G;
    lk_pack<T, W> v[SR];
    int plo[SR], phi[SR];   /* ROPE: each row's position id, as loaded */
    int64_t xo[SR], yo[SR], tok[SR];
    uint32_t q[SR], h[SR];
    if (rw.y.inner == rw.x.inner && (!ROPE || rp.heads == rw.x.inner) && split_rows<SR>(rw.x.inner, base, RPW, q, h)) {
#pragma unroll
        for (int s = 0; s < SR; s++) xo[s] = row_of(rw.x, q[s], h[s]), yo[s] = row_of(rw.y, q[s], h[s]), tok[s] = q[s];
    } else {
        rows_at<SR>(rw.x, base, RPW, xo), rows_at<SR>(rw.y, base, RPW, yo);
        if (ROPE) rows_at<SR>(token_rows(rp), base, RPW, tok);
    }
#pragma unroll
    for (int s = 0; s < SR; s++) {
        const int64_t r = base + s * RPW;
        if (r < rows && g < units) lk_ldp<T, W>(x + xo[s] + g * W, v[s]);
        if (ROPE && r < rows) rope_id_load(rp, tok[s], plo[s], phi[s]);
    }
    float wv[W];
    if (w && g < units) ld_weight<T, TW, W>(w + g * W, wv);
    float ca[W], sa[W];   /* ROPE: the angles, asked for before the group sum */
#pragma unroll
    for (int s = 0; s < SR; s++) {
        const int64_t r = base + s * RPW;
        const bool live = r < rows && g < units;
        if (ROPE && new_angles(plo, phi, s, r < rows)) rope_angles<W, G>(rp, r < rows, plo[s], phi[s], g, ca, sa);
        float ss = 0.0f;
        if (live)
#pragma unroll
            for (int j = 0; j < W; j++) ss = fmaf(v[s].f(j), v[s].f(j), ss);
        const float rs = rsqrtf(lk_group_sum<G>(ss) / (float)(ROPE ? G * W : n) + eps);
        if (r < rows && g == 0) rstd[r] = rs;
        float o[W];
        if (ROPE) {   /* units == G: every lane of a live row is live; the shuffles take all */
            lk_pack<T, W> yv;   /* y as the norm stores it */
#pragma unroll
            for (int j = 0; j < W; j++) yv.e[j] = lk_from_f32<T>(live ? v[s].f(j) * rs * (w ? wv[j] + off : 1.0f) : 0.0f);
            rope_unit<T, W, G>(yv, g, ca, sa, 1.0f, o);
        } else if (live) {
#pragma unroll
            for (int j = 0; j < W; j++) o[j] = v[s].f(j) * rs * (w ? wv[j] + off : 1.0f);
        }
        if (live) lk_stw<T, W>(y + yo[s] + g * W, o);
    }
}

template <typename T, typename TW, int W, int G, bool ROPE>
__global__ void __launch_bounds__(SHORT_THREADS) bwd_short(const T *__restrict__ x, const TW *__restrict__ w,
                                                           const T *dy, T *dx, const float *__restrict__ rstd,
                                                           float *__restrict__ partial, int64_t rows, int n, float off,
                                                           bwd_rows rw, norm_rope rp) {
    constexpr int RPW = 32 / G, PER_BLOCK = (SHORT_THREADS / 32) * RPW * SR;
    __shared__ float red[SHORT_THREADS][W + 1];
    const int lane = threadIdx.x & 31, g = lane % G, units = n / W;
    float acc[W], wv[W];
#pragma unroll
    for (int j = 0; j < W; j++) acc[j] = 0.0f, wv[j] = 1.0f - off;   /* no weight: g = dy */
    if (w && g < units) ld_weight<T, TW, W>(w + g * W, wv);
    for (int64_t c0 = (int64_t)blockIdx.x * PER_BLOCK; c0 < rows; c0 += (int64_t)gridDim.x * PER_BLOCK) {
        const int64_t base = c0 + (threadIdx.x >> 5) * RPW * SR + lane / G;
        lk_pack<T, W> xv[SR], dv[SR];
        float rsv[SR];          /* each row's rstd, with its loads */
        int plo[SR], phi[SR];   /* ROPE: each row's position id, as loaded */
        int64_t xo[SR], dyo[SR], dxo[SR], tok[SR];
        uint32_t q[SR], h[SR];
        if (rw.dy.inner == rw.x.inner && rw.dx.inner == rw.x.inner && (!ROPE || rp.heads == rw.x.inner) &&
            split_rows<SR>(rw.x.inner, base, RPW, q, h)) {
#pragma unroll
            for (int s = 0; s < SR; s++) {
                xo[s] = row_of(rw.x, q[s], h[s]), dyo[s] = row_of(rw.dy, q[s], h[s]);
                dxo[s] = row_of(rw.dx, q[s], h[s]), tok[s] = q[s];
            }
        } else {
            rows_at<SR>(rw.x, base, RPW, xo), rows_at<SR>(rw.dy, base, RPW, dyo), rows_at<SR>(rw.dx, base, RPW, dxo);
            if (ROPE) rows_at<SR>(token_rows(rp), base, RPW, tok);
        }
#pragma unroll
        for (int s = 0; s < SR; s++) {
            const int64_t r = base + s * RPW;
            if (r < rows && g < units) {
                lk_ldp<T, W>(x + xo[s] + g * W, xv[s]);
                lk_ldp<T, W>(dy + dyo[s] + g * W, dv[s]);
            }
            if (r < rows) {
                rsv[s] = rstd[r];
                if (ROPE) rope_id_load(rp, tok[s], plo[s], phi[s]);
            }
        }
        float ca[W], sa[W];   /* ROPE: the angles */
#pragma unroll
        for (int s = 0; s < SR; s++) {
            const int64_t r = base + s * RPW;
            const bool live = r < rows && g < units;
            if (ROPE) {   /* dy rotated back and rounded, as the fused RoPE's backward stores it */
                float d[W];
                if (new_angles(plo, phi, s, r < rows)) rope_angles<W, G>(rp, r < rows, plo[s], phi[s], g, ca, sa);
                rope_unit<T, W, G>(dv[s], g, ca, sa, -1.0f, d);
#pragma unroll
                for (int j = 0; j < W; j++) dv[s].e[j] = lk_from_f32<T>(d[j]);
            }
            float dot = 0.0f;
            if (live)
#pragma unroll
                for (int j = 0; j < W; j++) dot = fmaf(dv[s].f(j) * (wv[j] + off), xv[s].f(j), dot);
            dot = lk_group_sum<G>(dot);
            if (!live) continue;
            const float rs = rsv[s], mean = dot * rs / (float)(ROPE ? G * W : n);
            float o[W];
#pragma unroll
            for (int j = 0; j < W; j++) {
                const float d = dv[s].f(j), xh = xv[s].f(j) * rs;
                acc[j] = fmaf(d, xh, acc[j]);
                o[j] = rs * fmaf(-xh, mean, d * (wv[j] + off));   /* the CPU row's g − x̂·m, pinned: ROPE rounds as the plain one */
            }
            lk_stw<T, W>(dx + dxo[s] + g * W, o);
        }
    }
    if (partial == NULL) return;
#pragma unroll
    for (int j = 0; j < W; j++) red[threadIdx.x][j] = acc[j];
    __syncthreads();
    /* unit u of the row: the lanes u, u + G, ... of every warp, in that order */
    for (int u = threadIdx.x; u < units; u += SHORT_THREADS)
#pragma unroll
        for (int j = 0; j < W; j++) {
            float sum = 0.0f;
            for (int t = u; t < SHORT_THREADS; t += G) sum += red[t][j];
            partial[(int64_t)blockIdx.x * n + u * W + j] = sum;
        }
}

/* The short-row kernels for rows of 2 .. 32 accesses of 16 bytes (not the residual mode:
 * its rows are a model's hidden size); *taken says whether they ran. */
template <typename T, int W>
static int takes_short(const lk_rms_norm_args *a, int units, int64_t rows) {
    return !a->residual.data && W == lk_vec<T>::N && units >= 2 && units <= 32 && rows > 0;
}

static int short_group(int units) {
    int G = 2;
    while (G < units) G *= 2;
    return G;
}

/* The rows the short kernels pair for rope: 2-32 16-byte accesses, a power of two (a lane's
 * partner dims one shuffle away). The vtable's takes_rope_rows; rope_refused's rule. */
static int rope_rows(int64_t n, lk_dtype dt) {
    const int64_t vw = 16 / (int64_t)lk_dtype_size(dt), units = n / vw;
    return n % vw == 0 && units >= 2 && units <= 32 && (units & (units - 1)) == 0;
}

/* rope runs on the short kernels alone (units == G), on rows rope_rows pairs, 16-byte
 * aligned; anything else is refused by name before a launch (the facade checked the rest). */
static lk_status rope_refused(const plan *p, const lk_rms_norm_args *a, int64_t rows, int64_t n) {
    if (a->rope == NULL || rows == 0) return LK_OK;
    const int vw = 16 / (int)lk_dtype_size(a->x.dtype);
    if (p->w != vw)
        return lk_error(LK_EINVAL, "rms_norm: fused (cuda): rope: expected rows of 16-byte accesses (n a multiple of %d, "
                        "every tensor's rows 16-byte aligned), got n = %lld%s", vw, (long long)n,
                        n % vw ? "" : " with a row or pointer not 16-byte aligned");
    const int64_t units = n / vw;
    if (!rope_rows(n, a->x.dtype))
        return lk_error(LK_EINVAL, "rms_norm: fused (cuda): rope: expected rows of 2, 4, 8, 16 or 32 16-byte accesses "
                        "(n = %d, %d, %d, %d or %d), got %lld (n = %lld)", 2 * vw, 4 * vw, 8 * vw, 16 * vw, 32 * vw,
                        (long long)units, (long long)n);
    if (rows > INT32_MAX)
        return lk_error(LK_EINVAL, "rms_norm: fused (cuda): rope: expected fewer than 2^31 rows, got %lld",
                        (long long)rows);
    return LK_OK;
}

/* ROPE's arguments (rope_refused passed), or nothing without rope. */
static norm_rope norm_rope_of(const lk_rms_norm_args *a, int n) {
    norm_rope r = {};
    if (a->rope == NULL) return r;
    const lk_rms_norm_rope *q = a->rope;
    r.cos = (const float *)q->cos.data, r.sin = (const float *)q->sin.data, r.pos = q->position_ids.data;
    r.max_pos = q->cos.shape[0], r.pos64 = q->position_ids.dtype == LK_I64, r.heads = (int)a->x.shape[1];
    r.half = n / 2, r.vec = lk_aligned16(r.cos) && lk_aligned16(r.sin);
    return r;
}

template <typename T, typename TW, int W, bool ROPE>
static void (*fwd_short_of(int G))(const T *, const TW *, T *, float *, int64_t, int, float, float, fwd_rows, norm_rope) {
    return G == 2 ? fwd_short<T, TW, W, 2, ROPE> : G == 4 ? fwd_short<T, TW, W, 4, ROPE>
         : G == 8 ? fwd_short<T, TW, W, 8, ROPE> : G == 16 ? fwd_short<T, TW, W, 16, ROPE>
                  : fwd_short<T, TW, W, 32, ROPE>;
}

template <typename T, typename TW, int W, bool ROPE>
static void (*bwd_short_of(int G))(const T *, const TW *, const T *, T *, const float *, float *, int64_t, int, float,
                                   bwd_rows, norm_rope) {
    return G == 2 ? bwd_short<T, TW, W, 2, ROPE> : G == 4 ? bwd_short<T, TW, W, 4, ROPE>
         : G == 8 ? bwd_short<T, TW, W, 8, ROPE> : G == 16 ? bwd_short<T, TW, W, 16, ROPE>
                  : bwd_short<T, TW, W, 32, ROPE>;
}

template <typename T, typename TW, int W>
static lk_status launch_fwd_short(const lk_rms_norm_args *a, int64_t rows, int n, cudaStream_t st, int *taken) {
    const int units = n / W, G = short_group(units);
    *taken = 0;
    if (!takes_short<T, W>(a, units, rows)) return LK_OK;
    void (*k)(const T *, const TW *, T *, float *, int64_t, int, float, float, fwd_rows, norm_rope) =
        a->rope ? fwd_short_of<T, TW, W, true>(G) : fwd_short_of<T, TW, W, false>(G);
    const fwd_ptrs p = fwd_ptrs_of(a);
    const int64_t per_block = (SHORT_THREADS / 32) * (32 / G) * SR;
    k<<<(unsigned)lk_cdiv(rows, per_block), SHORT_THREADS, 0, st>>>((const T *)p.x, (const TW *)p.w, (T *)p.y,
                                                                    p.rstd, rows, n, (float)a->eps,
                                                                    a->weight_offset, p.m, norm_rope_of(a, n));
    LK_CUDA_LAUNCHED("rms_norm: fused (cuda) forward, short rows");
    *taken = 1;
    return LK_OK;
}

template <typename T, typename TW, int W>
static lk_status launch_bwd_short(const lk_rms_norm_args *a, float *partial, int64_t max_parts, int64_t rows, int n,
                                  cudaStream_t st, int64_t *parts, int *taken) {
    const int units = n / W, G = short_group(units);
    *taken = 0;
    if (!takes_short<T, W>(a, units, rows)) return LK_OK;
    void (*k)(const T *, const TW *, const T *, T *, const float *, float *, int64_t, int, float, bwd_rows,
              norm_rope) = a->rope ? bwd_short_of<T, TW, W, true>(G) : bwd_short_of<T, TW, W, false>(G);
    const int64_t per_block = (SHORT_THREADS / 32) * (32 / G) * SR;
    /* The grid is what fits of the ROPE kernel (the larger: 127 registers in bf16, 4 blocks an
     * SM; the plain one's 103 fit 4 too), with or without rope: the dweight parts follow the
     * grid, so a norm with rope and one without (then the fused RoPE) sum dweight in the same
     * order, to the same bits. */
    lk_status s = fit_grid(bwd_short_of<T, TW, W, true>(G), SHORT_THREADS,
                           max_parts < lk_cdiv(rows, per_block) ? max_parts : lk_cdiv(rows, per_block), parts);
    if (s) return s;
    bwd_rows rw;
    lk_rows_of(&a->x, &rw.x), lk_rows_of(&a->dy, &rw.dy), lk_rows_of(&a->dx, &rw.dx);
    k<<<(unsigned)*parts, SHORT_THREADS, 0, st>>>((const T *)a->x.data, (const TW *)a->weight.data,
                                                 (const T *)a->dy.data, (T *)a->dx.data, (const float *)a->saved.data,
                                                 partial, rows, n, a->weight_offset, rw, norm_rope_of(a, n));
    LK_CUDA_LAUNCHED("rms_norm: fused (cuda) backward, short rows");
    *taken = 1;
    return LK_OK;
}

/* ---- the vtable --------------------------------------------------------------- */

/* The most blocks of the backward grid, hence f32 partial rows of dweight the workspace
 * holds; launch_bwd runs as many of them as fit on the GPU at once. */
static int64_t bwd_parts(int64_t rows, int64_t n) {
    int sms = lk_hw_get()->cuda_sms > 0 ? lk_hw_get()->cuda_sms : 1;
    int64_t p = (int64_t)sms * (n <= SHORT_ROW ? BWD_BLOCKS_PER_SM_SHORT : BWD_BLOCKS_PER_SM);
    return rows < p ? (rows > 0 ? rows : 1) : p;
}

static size_t saved_bytes(int64_t rows, int64_t n, lk_dtype dt) { return (size_t)rows * sizeof(float); }

static size_t workspace_bytes(int64_t rows, int64_t n, lk_dtype dt, int backward) {
    return backward ? (size_t)bwd_parts(rows, n) * (size_t)n * sizeof(float) : 0;
}

/* bf16 x with the f32 master weight (rms_norm.h): TW = float. */
static int f32_weight(const lk_rms_norm_args *a) { return a->weight.data && a->weight.dtype == LK_F32; }

/* One pass for x of T and a weight of TW, at the plan's access width. */
template <typename T, typename TW>
static lk_status forward_as(const plan *p, const lk_rms_norm_args *a, int64_t rows, int n, cudaStream_t st) {
    const int V = lk_vec<T>::N;
    int taken = 0;
    lk_status s = p->w == V ? launch_fwd_short<T, TW, V>(a, rows, n, st, &taken) : LK_OK;
    if (s || taken) return s;
    s = p->w == 1 ? launch_fwd_warp<T, TW, 1>(a, rows, n, st, &taken) : launch_fwd_warp<T, TW, V>(a, rows, n, st, &taken);
    if (s || taken) return s;
    return p->w == 1 ? launch_fwd<T, TW, 1>(p, a, rows, n, st) : launch_fwd<T, TW, V>(p, a, rows, n, st);
}

template <typename T, typename TW>
static lk_status backward_as(const plan *p, const lk_rms_norm_args *a, float *partial, int64_t mp, int64_t rows,
                             int n, cudaStream_t st, int64_t *parts) {
    const int V = lk_vec<T>::N;
    int taken = 0;
    lk_status s = p->w == V ? launch_bwd_short<T, TW, V>(a, partial, mp, rows, n, st, parts, &taken) : LK_OK;
    if (s || taken) return s;
    return p->w == 1 ? launch_bwd<T, TW, 1>(p, a, partial, mp, rows, n, st, parts)
                     : launch_bwd<T, TW, V>(p, a, partial, mp, rows, n, st, parts);
}

static lk_status forward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (n > INT32_MAX / 2 || rows > INT32_MAX)
        return lk_error(LK_ESHAPE, "rms_norm: fused (cuda): x: expected rows and n below 2^31, got %lld x %lld",
                        (long long)rows, (long long)n);
    const void *ptrs[] = {a->x.data, a->weight.data, a->y.data, a->residual.data, a->delta.data};
    const lk_tensor *views[] = {&a->x, &a->y};
    plan p = plan_of(n, a->x.dtype, ptrs, 5, views, 2);
    lk_status s = rope_refused(&p, a, rows, n);
    if (s) return s;
    if (a->x.dtype == LK_F32) return forward_as<float, float>(&p, a, rows, (int)n, st);
    if (f32_weight(a)) return forward_as<lk_bf16_t, float>(&p, a, rows, (int)n, st);
    return forward_as<lk_bf16_t, lk_bf16_t>(&p, a, rows, (int)n, st);
}

static lk_status backward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (rows == 0) return lk_rms_dw_zero(a, st);
    if (n > INT32_MAX / 2)
        return lk_error(LK_ESHAPE, "rms_norm: fused (cuda): x: expected n below 2^30, got %lld", (long long)n);
    const void *ptrs[] = {a->x.data, a->weight.data, a->dy.data, a->dx.data, a->residual.data};
    const lk_tensor *views[] = {&a->x, &a->dy, &a->dx};
    plan p = plan_of(n, a->x.dtype, ptrs, 5, views, 3);
    lk_status s = rope_refused(&p, a, rows, n);   /* before the workspace is taken */
    if (s) return s;
    int want_dw = a->weight.data && a->dweight.data;
    int64_t parts = 0;
    float *partial = NULL;
    if (want_dw && (partial = (float *)lk_arena_alloc(ctx->arena, workspace_bytes(rows, n, a->x.dtype, 1))) == NULL)
        return lk_error(LK_EINTERNAL, "rms_norm: fused (cuda): the dweight workspace was not reserved");
    int64_t mp = bwd_parts(rows, n);
    s = a->x.dtype == LK_F32 ? backward_as<float, float>(&p, a, partial, mp, rows, (int)n, st, &parts)
        : f32_weight(a)      ? backward_as<lk_bf16_t, float>(&p, a, partial, mp, rows, (int)n, st, &parts)
                             : backward_as<lk_bf16_t, lk_bf16_t>(&p, a, partial, mp, rows, (int)n, st, &parts);
    if (s) return s;
    return want_dw ? lk_rms_dw_finish(partial, parts, (int)n, a->dweight.data, a->dweight.dtype, st) : LK_OK;
}

extern "C" const lk_rms_norm_vtable lk_rms_norm_cuda_fused_vtable = {
    LK_RMS_NORM_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward, /* takes_views */ 1,
    /* takes_rope: on the short kernels, rows of 2-32 16-byte accesses a power of two (a
     * head's 16-256 bf16, 8-128 f32); other rows are refused by rope_refused */ 1, rope_rows,
};
