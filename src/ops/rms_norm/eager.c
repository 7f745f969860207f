/* eager.c — `eager` RMSNorm: the unfused composition a framework without fused kernels
 * runs, i.e. autograd of  x * rsqrt(mean(x², -1) + eps) * w.  Every step (square, mean,
 * rsqrt, scale, weight; and backward the product, reduction and sum of each) is its own
 * pass over memory into its own intermediate from ctx->arena, rounded to the
 * intermediate dtype `it` as a framework tensor would be. Reductions accumulate in f32.
 * It saves what autograd keeps: rstd and x̂ = x·rstd, in `it`.
 *
 * Two rows run these steps: `eager` with it = the input dtype, and `eager_fp32` with
 * it = f32 (the inputs upcast first, the outputs cast back last), the way a framework's
 * norm that says `x.float()` runs: the same memory traffic shape, less rounding in bf16.
 * Both are there to be measured and checked against: this is the baseline the fused
 * kernel has to beat, not a fast path.
 *
 * The residual mode (rms_norm.h) is one more step each way, as a framework runs it: the
 * add into the f32 residual and the cast to x before the forward's steps, and after the
 * backward's (dx as the steps left it, in `it`: rounded to bf16 for `eager` bf16) the
 * add into the residual and the cast of the sum to dx. The forward's steps take the
 * stream in `it`: eager_fp32 the f32 residual itself, `eager` its rounding to x's dtype,
 * which is x (with norm_of_x both take x). The saved x̂ is then the stream's; the
 * backward differentiates x̂ = x·rstd of the kept x (rms_norm.h), so in this mode it
 * makes that x̂ again for dweight (the same bits as the saved one wherever the forward
 * read x). The stream in x's dtype (a bf16 residual, rms_norm.h) takes the same steps
 * with the residual read in its dtype and not written: x = the sum's rounding, which
 * both rows then normalize as x; dx = the rounding of residual + dx (dx in `it`).
 *
 * An f32 weight beside bf16 x (rms_norm.h) stays f32, as a framework's bf16 · f32
 * promotes: the weight steps multiply in f32 and round once to `it` (for `eager`,
 * x̂ and g = dy·w are still bf16 tensors), and dweight's f32 column sum is stored as is. */
#include "llmkern/rms_norm.h"

#include <math.h>
#include <omp.h>
#include <string.h>

/* Fewer elements than this run on one thread. */
#define EAGER_PAR_MIN ((int64_t)1 << 15)

/* lk_f32_to_bf16 without its early return, so the conversion loops vectorize: the same
 * bits for every input. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* Element i as f32, and stored back rounded to dt (the per-row scalars). */
static inline float ld(const void *p, lk_dtype dt, int64_t i) {
    return dt == LK_F32 ? ((const float *)p)[i] : lk_bf16_to_f32(((const uint16_t *)p)[i]);
}
static inline void st(void *p, lk_dtype dt, int64_t i, float v) {
    if (dt == LK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = to_bf16(v);
}

/* The steps stream their operands in chunks that stay in L1, converted to f32 on the way
 * in and rounded on the way out, as a framework's vectorized bf16 kernels do; an f32
 * operand is used in place. */
#define CHUNK 512

static inline const float *chunk_in(const void *p, lk_dtype dt, int64_t i0, int64_t len, float *buf) {
    if (dt == LK_F32) return (const float *)p + i0;
    const uint16_t *h = (const uint16_t *)p + i0;
    for (int64_t i = 0; i < len; i++) buf[i] = lk_bf16_to_f32(h[i]);
    return buf;
}
/* Where the f32 results bound for p[i0..] go before chunk_out: p itself for f32. */
static inline float *chunk_dst(void *p, lk_dtype dt, int64_t i0, float *buf) {
    return dt == LK_F32 ? (float *)p + i0 : buf;
}
static inline void chunk_out(void *p, lk_dtype dt, int64_t i0, int64_t len, const float *buf) {
    if (dt == LK_F32) return;
    uint16_t *h = (uint16_t *)p + i0;
    for (int64_t i = 0; i < len; i++) h[i] = to_bf16(buf[i]);
}

static inline int64_t chunk_len(int64_t c, int64_t end) { return end - c < CHUNK ? end - c : CHUNK; }

/* --- the steps: each one pass, all buffers in dtype dt ------------------------------ */

typedef enum { EW_MUL, EW_ADD } ew_op;

/* out = a ∘ b elementwise */
static void ew(const void *a, const void *b, void *out, int64_t count, ew_op op, lk_dtype dt) {
    #pragma omp parallel for schedule(static) if (count >= EAGER_PAR_MIN)
    for (int64_t c = 0; c < count; c += CHUNK) {
        float ba[CHUNK], bb[CHUNK], bo[CHUNK];
        int64_t len = chunk_len(c, count);
        const float *x = chunk_in(a, dt, c, len, ba), *y = chunk_in(b, dt, c, len, bb);
        float *o = chunk_dst(out, dt, c, bo);
        if (op == EW_MUL)
            for (int64_t i = 0; i < len; i++) o[i] = x[i] * y[i];
        else
            for (int64_t i = 0; i < len; i++) o[i] = x[i] + y[i];
        chunk_out(out, dt, c, len, bo);
    }
}

/* out[r, j] = a[r, j] · s[r]  (a [rows, 1] operand broadcast along the row) */
static void mul_per_row(const void *a, const void *s, void *out, int64_t rows, int64_t n, lk_dtype dt) {
    #pragma omp parallel for schedule(static) if (rows * n >= EAGER_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float ba[CHUNK], bo[CHUNK], sr = ld(s, dt, r);
        for (int64_t c = 0; c < n; c += CHUNK) {
            int64_t len = chunk_len(c, n);
            const float *x = chunk_in(a, dt, r * n + c, len, ba);
            float *o = chunk_dst(out, dt, r * n + c, bo);
            for (int64_t i = 0; i < len; i++) o[i] = x[i] * sr;
            chunk_out(out, dt, r * n + c, len, bo);
        }
    }
}

/* out[r, j] = a[r, j] · v[j]  (an [n] operand broadcast over rows, of vt: dt, or the
 * f32 weight beside bf16 a, the product then f32 rounded once as a framework's
 * bf16 · f32 promotes) */
static void mul_per_col(const void *a, const void *v, lk_dtype vt, void *out, int64_t rows, int64_t n, lk_dtype dt) {
    #pragma omp parallel for schedule(static) if (rows * n >= EAGER_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float ba[CHUNK], bv[CHUNK], bo[CHUNK];
        for (int64_t c = 0; c < n; c += CHUNK) {
            int64_t len = chunk_len(c, n);
            const float *x = chunk_in(a, dt, r * n + c, len, ba), *y = chunk_in(v, vt, c, len, bv);
            float *o = chunk_dst(out, dt, r * n + c, bo);
            for (int64_t i = 0; i < len; i++) o[i] = x[i] * y[i];
            chunk_out(out, dt, r * n + c, len, bo);
        }
    }
}

/* out[r] = scale · Σ_j a[r, j], accumulated in f32 (sum: scale 1, mean: 1/n) */
static void row_sum(const void *a, void *out, int64_t rows, int64_t n, float scale, lk_dtype dt) {
    #pragma omp parallel for schedule(static) if (rows * n >= EAGER_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float ba[CHUNK], s = 0.0f;
        for (int64_t c = 0; c < n; c += CHUNK) {
            int64_t len = chunk_len(c, n);
            const float *x = chunk_in(a, dt, r * n + c, len, ba);
            #pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < len; i++) s += x[i];
        }
        st(out, dt, r, s * scale);
    }
}

/* out[j] = Σ_r a[r, j] into f32 acc [n], stored as ot; each thread owns a band of
 * columns and walks the rows in order, so the sum is the same whatever the thread count. */
static void col_sum(const void *a, void *out, lk_dtype ot, float *acc, int64_t rows, int64_t n, lk_dtype dt) {
    #pragma omp parallel if (rows * n >= EAGER_PAR_MIN)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t j0 = n * t / nt, j1 = n * (t + 1) / nt;
        float ba[CHUNK];
        for (int64_t j = j0; j < j1; j++) acc[j] = 0.0f;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = j0; c < j1; c += CHUNK) {
                int64_t len = chunk_len(c, j1);
                const float *x = chunk_in(a, dt, r * n + c, len, ba);
                for (int64_t i = 0; i < len; i++) acc[c + i] += x[i];
            }
        for (int64_t j = j0; j < j1; j++) st(out, ot, j, acc[j]);
    }
}

/* The residual mode's step: res += add (of at; NULL: nothing added), then out = res
 * rounded to dt. A residual of x's dtype (rt = dt, not f32) is only read; it may be out. */
static void residual_step(void *res, lk_dtype rt, const void *add, void *out, lk_dtype at, lk_dtype dt,
                          int64_t count) {
    #pragma omp parallel for schedule(static) if (count >= EAGER_PAR_MIN)
    for (int64_t i = 0; i < count; i++) {
        float r = add ? ld(res, rt, i) + ld(add, at, i) : ld(res, rt, i);
        if (rt == LK_F32) ((float *)res)[i] = r;
        st(out, dt, i, r);
    }
}

/* --- the composition -------------------------------------------------------------- */

typedef struct {
    lk_arena *arena;
    lk_status status;
} taker;

/* An intermediate of count elements of dt; the facade reserved them all. */
static void *take(taker *tk, int64_t count, lk_dtype dt) {
    void *p = lk_arena_alloc(tk->arena, (size_t)count * lk_dtype_size(dt));
    if (p == NULL && tk->status == LK_OK)
        tk->status = lk_error(LK_EINTERNAL, "rms_norm: eager: workspace was not reserved");
    return p;
}

/* The input in it: itself when it is already, otherwise an upcast copy. */
static const void *as_it(taker *tk, const void *src, lk_dtype dt, int64_t count, lk_dtype it) {
    if (src == NULL || dt == it) return src;
    void *p = take(tk, count, it);
    if (p) lk_convert(src, dt, p, it, count);
    return p;
}

/* saved: rstd [rows] then x̂ [rows, n], both in it. */
static size_t steps_saved_bytes(int64_t rows, int64_t n, lk_dtype it) {
    size_t isz = lk_dtype_size(it);
    return lk_arena_piece((size_t)rows * isz) + (size_t)(rows * n) * isz;
}

/* Mirrors the take() calls below, in order; a vector [n] counted as f32 (the weight's
 * may be, whatever it). */
static size_t steps_workspace_bytes(int64_t rows, int64_t n, lk_dtype dt, lk_dtype it, int backward) {
    size_t isz = lk_dtype_size(it), whole = lk_arena_piece((size_t)(rows * n) * isz);
    size_t vec = lk_arena_piece((size_t)n * sizeof(float)), per_row = lk_arena_piece((size_t)rows * isz);
    size_t upcast = dt != it ? (backward ? 2 * whole : whole) + vec : 0;
    if (!backward) return upcast + whole + per_row + vec;                  /* sq, mean, w_eff */
    return upcast + vec + 2 * whole + vec + 2 * per_row;                   /* w_eff, A, B, acc, dr, dm */
}

/* The dtype the weight's steps run in: it, or f32 for an f32 weight (rms_norm.h). */
static lk_dtype weight_it(const lk_rms_norm_args *a, lk_dtype it) {
    return a->weight.data && a->weight.dtype == LK_F32 ? LK_F32 : it;
}

/* The norm of src (of sdt: x, or the residual mode's f32 stream) into y. */
static lk_status steps_forward(const lk_rms_norm_args *a, lk_ctx *ctx, lk_dtype it, const void *src, lk_dtype sdt) {
    lk_dtype dt = a->x.dtype;
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n, all = rows * n;
    taker tk = {ctx->arena, LK_OK};
    void *rstd = a->saved.data, *xhat = (char *)a->saved.data + lk_arena_piece((size_t)rows * lk_dtype_size(it));

    lk_dtype wi = weight_it(a, it);
    const void *x = as_it(&tk, src, sdt, all, it);
    const void *w = as_it(&tk, a->weight.data, a->weight.dtype, n, wi);
    void *sq = take(&tk, all, it), *ms = take(&tk, rows, it), *weff = take(&tk, n, wi);
    if (tk.status) return tk.status;

    ew(x, x, sq, all, EW_MUL, it);                               /* x²               */
    row_sum(sq, ms, rows, n, 1.0f / (float)n, it);               /* mean(x², -1)     */
    for (int64_t r = 0; r < rows; r++)                           /* rsqrt(· + eps)   */
        st(rstd, it, r, (float)(1.0 / sqrt((double)ld(ms, it, r) + a->eps)));
    mul_per_row(x, rstd, xhat, rows, n, it);                     /* x̂ = x · rstd     */

    /* y = x̂ · (offset + w); with it != dt it lands in sq (dead by now) and is cast back. */
    void *y = dt == it ? a->y.data : sq;
    if (w == NULL) {
        lk_convert(xhat, it, a->y.data, dt, all);
        return LK_OK;
    }
    if (a->weight_offset != 0.0f) {
        for (int64_t j = 0; j < n; j++) st(weff, wi, j, a->weight_offset + ld(w, wi, j));
        w = weff;
    }
    mul_per_col(xhat, w, wi, y, rows, n, it);
    if (y != a->y.data) lk_convert(y, it, a->y.data, dt, all);
    return LK_OK;
}

/* Autograd's order: g = dy·w_eff; dw = Σ_rows dy·x̂; d(rstd) = Σ_j g·x;
 * d(mean) = −½·d(rstd)·rstd³; dx = g·rstd + 2x·d(mean)/n. Element j of dy is read only
 * before the last step writes dx, so dx may be dy. */
static lk_status steps_backward(const lk_rms_norm_args *a, lk_ctx *ctx, lk_dtype it) {
    lk_dtype dt = a->x.dtype;
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n, all = rows * n;
    taker tk = {ctx->arena, LK_OK};
    const void *rstd = a->saved.data;
    const void *xhat = (const char *)a->saved.data + lk_arena_piece((size_t)rows * lk_dtype_size(it));

    lk_dtype wi = weight_it(a, it);
    const void *x = as_it(&tk, a->x.data, dt, all, it);
    const void *dy = as_it(&tk, a->dy.data, dt, all, it);
    const void *w = as_it(&tk, a->weight.data, a->weight.dtype, n, wi);
    void *weff = take(&tk, n, wi), *A = take(&tk, all, it), *B = take(&tk, all, it);
    float *acc = take(&tk, n, LK_F32);
    void *dr = take(&tk, rows, it), *dm = take(&tk, rows, it);
    if (tk.status) return tk.status;

    const void *g = dy;
    if (w) {
        if (a->weight_offset != 0.0f) {
            for (int64_t j = 0; j < n; j++) st(weff, wi, j, a->weight_offset + ld(w, wi, j));
            w = weff;
        }
        mul_per_col(dy, w, wi, A, rows, n, it);                  /* g = dy · w_eff   */
        g = A;
        if (a->dweight.data) {
            if (a->residual.data) {                              /* x̂ of the kept x  */
                mul_per_row(x, rstd, B, rows, n, it);
                xhat = B;
            }
            ew(dy, xhat, B, all, EW_MUL, it);                    /* dy · x̂           */
            col_sum(B, a->dweight.data, a->dweight.dtype, acc, rows, n, it);   /* dw, the weight's dtype */
        }
    }
    ew(g, x, B, all, EW_MUL, it);                                /* g · x            */
    row_sum(B, dr, rows, n, 1.0f, it);                           /* d(rstd)          */
    for (int64_t r = 0; r < rows; r++) {                         /* rsqrt backward   */
        float s = ld(rstd, it, r);
        st(dm, it, r, -0.5f * ld(dr, it, r) * s * s * s);
    }
    for (int64_t r = 0; r < rows; r++)                           /* mean backward, ·2 of pow */
        st(dm, it, r, 2.0f * ld(dm, it, r) / (float)n);
    mul_per_row(g, rstd, B, rows, n, it);                        /* g · rstd         */
    mul_per_row(x, dm, A, rows, n, it);                          /* 2x · d(mean)/n   */
    void *dx = dt == it && !a->residual.data ? a->dx.data : B;   /* the residual may be dx */
    ew(B, A, dx, all, EW_ADD, it);                               /* dx               */
    if (a->residual.data) {                                      /* residual += dx (in it); dx = its rounding */
        residual_step(a->residual.data, a->residual.dtype, dx, a->dx.data, it, dt, all);
        return LK_OK;
    }
    if (dx != a->dx.data) lk_convert(dx, it, a->dx.data, dt, all);
    return LK_OK;
}

/* The residual mode's step first; the steps then read the stream in it: the f32
 * residual for it = f32, else x (its rounding); with norm_of_x or the stream in x's
 * dtype, x. */
static lk_status residual_forward(const lk_rms_norm_args *a, lk_ctx *ctx, lk_dtype it) {
    if (!a->residual.data) return steps_forward(a, ctx, it, a->x.data, a->x.dtype);
    residual_step(a->residual.data, a->residual.dtype, a->delta.data, a->x.data, a->x.dtype, a->x.dtype,
                  lk_tensor_numel(&a->x));
    if (a->norm_of_x || it != LK_F32 || a->residual.dtype != LK_F32)
        return steps_forward(a, ctx, it, a->x.data, a->x.dtype);
    return steps_forward(a, ctx, it, a->residual.data, LK_F32);
}

/* --- the rows: `eager` runs the steps in the input dtype, `eager_fp32` in f32 -------- */

static size_t eager_saved(int64_t rows, int64_t n, lk_dtype dt) { return steps_saved_bytes(rows, n, dt); }
static size_t fp32_saved(int64_t rows, int64_t n, lk_dtype dt) { return steps_saved_bytes(rows, n, LK_F32); }

static size_t eager_workspace(int64_t rows, int64_t n, lk_dtype dt, int backward) {
    return steps_workspace_bytes(rows, n, dt, dt, backward);
}
static size_t fp32_workspace(int64_t rows, int64_t n, lk_dtype dt, int backward) {
    return steps_workspace_bytes(rows, n, dt, LK_F32, backward);
}

static lk_status eager_forward(const lk_rms_norm_args *a, lk_ctx *ctx) { return residual_forward(a, ctx, a->x.dtype); }
static lk_status eager_backward(const lk_rms_norm_args *a, lk_ctx *ctx) { return steps_backward(a, ctx, a->x.dtype); }
static lk_status fp32_forward(const lk_rms_norm_args *a, lk_ctx *ctx) { return residual_forward(a, ctx, LK_F32); }
static lk_status fp32_backward(const lk_rms_norm_args *a, lk_ctx *ctx) { return steps_backward(a, ctx, LK_F32); }

const lk_rms_norm_vtable lk_rms_norm_eager_vtable = {
    .version = LK_RMS_NORM_VTABLE_VERSION,
    .saved_bytes = eager_saved,
    .workspace_bytes = eager_workspace,
    .forward = eager_forward,
    .backward = eager_backward,
};

const lk_rms_norm_vtable lk_rms_norm_eager_fp32_vtable = {
    .version = LK_RMS_NORM_VTABLE_VERSION,
    .saved_bytes = fp32_saved,
    .workspace_bytes = fp32_workspace,
    .forward = fp32_forward,
    .backward = fp32_backward,
};
