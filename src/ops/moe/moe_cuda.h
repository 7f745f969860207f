/* moe_cuda.h — what the CUDA MoE experts' files share: the routing on the device
 * (route.cu: counts, offsets and the stable expert-sorted permutation, sized by the
 * route bound R = T·k known on the host) and the grouped GEMM with device-side problem
 * sizes (grouped.cu), both queued on a stream with no host read, so fused.cu's forward
 * and backward can be captured in a CUDA graph. C linkage; built with CUDA only. Not
 * installed. */
#ifndef LLMKERN_MOE_CUDA_H
#define LLMKERN_MOE_CUDA_H

#include "ops/moe/permute.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device workspace of lk_moe_cuda_route for R routes over E experts. */
size_t lk_moe_cuda_route_ws_bytes(int64_t routes, int64_t experts);

/* The stable counting sort of permute.c on the device: offs [E + 1] (i64), order [R] and
 * pos [R] exactly as lk_moe_permute writes them (token-major within an expert, so the
 * result never depends on scheduling). *flag (device int) is zeroed, then set to 1 when
 * an id lies outside [0, E); such a route is sorted as expert 0, so every array stays in
 * bounds, and the callers turn their outputs into NaN (see fused.cu). ws: device memory
 * of lk_moe_cuda_route_ws_bytes, 64-byte aligned. Errors: LK_EDEVICE (a launch). */
lk_status lk_moe_cuda_route(const int32_t *ids, int64_t routes, int64_t experts, int64_t *offs, int32_t *order,
                            int32_t *pos, int *flag, void *ws, void *stream);

/* *flag = 1 if an id of ids[0..R) lies outside [0, E), else 0 (the backward's check). */
lk_status lk_moe_cuda_check_ids(const int32_t *ids, int64_t routes, int64_t experts, int *flag, void *stream);

/* --- grouped GEMM ---------------------------------------------------------------------
 * C = A·B per expert e, row-major, f32 accumulation, A(m, k) and B(k, n) read through
 * operands that are either contiguous along K (kmajor: element (x, k) at
 * row(x)[k], x = m or n) or along M / N (element (x, k) at row(k)[x]). An operand row is
 * src + e·e_stride + i·ld, or, gathered, src + (order[i] / kdiv)·ld (the token row of
 * sorted route i: the permutation fused into the load).
 *   LK_GG_ROWS:  M runs over the expert-sorted rows, expert e owning rows
 *                [offs[e], offs[e+1]); N and K fixed. The row tiles of every expert are
 *                listed on the device (tiles, E + 1 ints of workspace) and the grid is
 *                sized by the bound rows / tile + E, so no count is read back.
 *   LK_GG_WGRAD: M and N fixed (a weight's dims), K runs over expert e's rows; C is
 *                expert e's slice (c + e·c_e_stride), ACCUMULATED (C += A·B, rounded
 *                once into c_dt; an expert without rows leaves its slice as it was), or
 *                with STORE written (C = A·B; zeros for an expert without rows): natively
 *                by the Hopper kernel's TMA epilogue, elsewhere as zeros, then ACCUM.
 * Epilogues: STORE (C written in c_dt: f32, or bf16 rounded once), ACCUM (WGRAD), SWIGLU (ROWS, bf16 on tensor
 * cores only: N = 2I is gate | up, and the epilogue writes keep = [gate | up] in bf16
 * and h = w[order[row]] · silu(gate) · up in bf16, NaN when *flag is set); DSWIGLU (ROWS,
 * bf16 on tensor cores: C = dh', N = I; from the saved [gate | up] (gu_saved) it writes
 * dgu = d[gate | up] and wh = w·h in bf16 and, when dw_part is given, each row's partial
 * Σ_j dh'_j·h_j over the CTA's columns into dw_part[row, n tile] — summed over the tiles
 * in order by lk_moe_cuda_dw_reduce; NaN when *flag is set).
 * bf16 operands run on tensor cores: on an sm_90 GPU the ROWS GEMMs whose operands TMA can
 * read (lk_moe_cuda_gg_sm90_takes) on wgmma (grouped_sm90.cu), the WGRAD ones likewise
 * (lk_moe_cuda_gg_sm90_wgrad_takes, grouped_wgrad_sm90.cu), the rest on mma.sync
 * m16n8k16 (sm_80+, grouped.cu); f32 on CUDA cores in f32 (the exact path f32 training is
 * checked against). */
typedef enum { LK_GG_ROWS, LK_GG_WGRAD } lk_gg_mode;
typedef enum { LK_GG_STORE, LK_GG_ACCUM, LK_GG_SWIGLU, LK_GG_DSWIGLU } lk_gg_epi;

typedef struct {
    const void *src;
    int64_t ld, e_stride;     /* elements */
    const int32_t *order;     /* NULL: rows are src + e·e_stride + i·ld */
    int64_t kdiv;             /* routes per token when gathered */
    int kmajor;
} lk_gg_operand;

typedef struct {
    lk_gg_mode mode;
    lk_gg_epi epi;
    lk_dtype dt;                  /* of A and B: f32 or bf16 */
    lk_gg_operand a, b;
    int64_t m, n, k;              /* ROWS: n, k (m is rows); WGRAD: m, n */
    int64_t experts, rows;        /* E, and the bound on sorted rows (R = T·k) */
    const int64_t *offs;          /* [E + 1] on the device */
    int32_t *tiles;               /* ROWS: [E + 1] ints of device workspace */
    void *c;                      /* STORE / ACCUM */
    lk_dtype c_dt;
    int64_t ldc, c_e_stride;
    void *keep, *h;               /* SWIGLU: [rows, 2I] and [rows, I], bf16 */
    const void *gu_saved;         /* DSWIGLU: [rows, 2I] bf16, SWIGLU's keep */
    void *dgu, *wh;               /* DSWIGLU: [rows, 2I] and [rows, I], bf16 */
    float *dw_part;               /* DSWIGLU: [rows, lk_moe_cuda_dw_tiles(I)] f32, or NULL */
    const float *w;               /* (D)SWIGLU: routing weights [R] */
    const int32_t *order;         /* (D)SWIGLU: route of each sorted row */
    int64_t inter;                /* (D)SWIGLU: I (SWIGLU: n = 2I; DSWIGLU: n = I) */
    const int *flag;              /* (D)SWIGLU: bad-id flag (device) */
    int hopper;                   /* 1: the Hopper kernel wherever it takes the GEMM, even under
                                     lk_moe_cuda_gg_sm80_only (the fused_sm90 row); 0: the device's default */
} lk_gg;

/* 1 when the SWIGLU and DSWIGLU epilogues run for operands of dt (bf16 on tensor cores);
 * else the caller stores f32 and runs the activations as their own kernels. */
int lk_moe_cuda_gg_fuses_swiglu(lk_dtype dt);

/* Column tiles of the DSWIGLU epilogue over I (dw_part's row length). */
int64_t lk_moe_cuda_dw_tiles(int64_t inter);

/* dw[order[p]] = Σ_t dw_part[p, t] in t order, p < rows (d_topk_weights, deterministic). */
lk_status lk_moe_cuda_dw_reduce(const float *dw_part, int64_t tiles, const int32_t *order, int64_t rows, float *dw,
                                void *stream);

/* on != 0: bf16 runs on the CUDA-core kernel too (and the activation as its own kernel),
 * until called again with 0 — tests/cuda run the bf16 cases both ways, so a wrong
 * tensor-core kernel shows as such. Not thread-safe; never set on the hot path. */
void lk_moe_cuda_gg_simt_only(int on);

/* on != 0: bf16 stays on the mma.sync kernel on an sm_90 GPU too (the `fused` row's GEMMs
 * that would run on grouped_sm90.cu or grouped_wgrad_sm90.cu), until called again with 0 — tests/cuda run the bf16
 * cases both ways. Not thread-safe; never set on the hot path. */
void lk_moe_cuda_gg_sm80_only(int on);

/* grouped_sm90.cu: 1 when the Hopper kernel takes g (bf16 ROWS: STORE with the sorted
 * rows as A, SWIGLU with B K-major, DSWIGLU with B N-major, the last two with A gathered;
 * K >= 8; K, the row strides and the expert stride multiples of 8 elements, the operands
 * 16-byte aligned; (D)SWIGLU: I a multiple of 8). Says nothing of the GPU. */
int lk_moe_cuda_gg_sm90_takes(const lk_gg *g);

/* Queues g on the Hopper kernel (an sm_90 GPU; g taken by lk_moe_cuda_gg_sm90_takes, its
 * tile list already built by grouped.cu's tile scan). Errors: LK_EDEVICE. */
lk_status lk_moe_cuda_gg_sm90(const lk_gg *g, void *stream);

/* grouped_sm90.cu's schedules: COOP, two consumer warpgroups sharing a 128 × 256 tile, its
 * epilogues on 16-byte accesses where the rows allow, or PINGPONG, each warpgroup a 128 × 128
 * tile of its own, its epilogue under the other's mainloop; PINGPONG_V4, PINGPONG with the
 * DSWIGLU and STORE epilogues on 16-byte accesses; AUTO (the default), each GEMM on the
 * schedule measured fastest for it (lk_moe_cuda_gg_sm90_schedule); COOP_CLUSTER, COOP on
 * clusters of two CTAs on adjacent row tiles of one expert, sharing the B tile's loads (TMA
 * multicast). grouped_wgrad_sm90.cu: PINGPONG and PINGPONG_V4 its ping-pong
 * kernel, COOP its cooperative one with C read, added and written by the consumers, AUTO the
 * cooperative one with C added by TMA reductions where C is f32 and TMA can address it. */
enum { LK_GG_SM90_COOP = 0, LK_GG_SM90_PINGPONG = 1, LK_GG_SM90_PINGPONG_V4 = 2, LK_GG_SM90_AUTO = 3,
       LK_GG_SM90_COOP_CLUSTER = 4, LK_GG_SM90_VARIANTS = 5 };

/* v >= 0: the Hopper kernels run schedule v until called again; v < 0: the environment's
 * (LLMKERN_GG_SM90: auto | coop | pingpong | pingpong_v4 | coop_cluster, read once). tests/cuda run each.
 * Not thread-safe; never set on the hot path. */
void lk_moe_cuda_gg_sm90_variant(int v);

/* The schedule in force (AUTO included). */
int lk_moe_cuda_gg_sm90_variant_in_force(void);

/* The schedule lk_moe_cuda_gg_sm90 runs g on: the one in force, AUTO resolved for g. */
int lk_moe_cuda_gg_sm90_schedule(const lk_gg *g);

/* grouped_wgrad_sm90.cu: 1 when the Hopper weight-gradient kernel takes g (bf16 WGRAD,
 * ACCUM or STORE into f32 or bf16 C with element pairs aligned and ldc, c_e_stride even; A and B M /
 * N contiguous, no expert stride, at most one of them gathered, 16-byte aligned, row strides
 * and M, N multiples of 8 elements). Says nothing of the GPU. */
int lk_moe_cuda_gg_sm90_wgrad_takes(const lk_gg *g);

/* Queues g (taken by lk_moe_cuda_gg_sm90_wgrad_takes) on the Hopper weight-gradient kernel
 * (an sm_90 GPU): the same sums as the mma.sync kernel's, each gradient element one
 * thread's, in row order. Errors: LK_EDEVICE. */
lk_status lk_moe_cuda_gg_sm90_wgrad(const lk_gg *g, void *stream);

/* Queues zeros over every expert's slice of WGRAD g's C (m rows of n elements, ldc apart):
 * a written weight gradient (STORE) on a kernel that only accumulates. Errors: LK_EDEVICE. */
lk_status lk_moe_cuda_wgrad_zero(const lk_gg *g, void *stream);

/* Queues the grouped GEMM on stream. Errors: LK_EINTERNAL (a combination this file does
 * not build), LK_EDEVICE (a launch; a grid dim over the device's limit). */
lk_status lk_moe_cuda_grouped_gemm(const lk_gg *g, void *stream);

#ifdef __cplusplus
}
#endif
#endif
