/* test_rms_norm.c (GPU) — the CUDA RMSNorm implementations (fused, eager_fp32) against the
 * float64 reference: f32 and bf16, shapes that take each kernel path (16-byte register
 * path, odd lengths on the scalar register path, rows too long for registers on the
 * looped path, an unaligned pointer; the forward's warp-a-row kernel on and off, rows
 * not a multiple of its rows per block, idle lanes, odd lengths), with and without weight, Gemma's offset, dx
 * written over dy, zero rows, outputs poisoned with NaN first. Tolerances, as the CPU
 * harness states them: f32 math and one rounding of each output, so f32 1e-5 (dweight
 * sums up to 4099 rows in f32: 2e-5) and bf16 1e-2 (2^-9 of an element at most).
 * The residual mode (rms_norm.h, issue 17's f32 stream): the harness's check case
 * (the norm of the f32 stream, or with norm_of_x of the written x; x and the forward's
 * residual exact, y / dx / the backward's residual at the same tolerances) on shapes
 * that take each forward kernel with the flag set, with and without a delta, dx over
 * dy; y the rounding of the exact norm of the stream (not of x) on each forward kernel;
 * with norm_of_x the residual forward's y and rstd bit for bit the plain forward's on
 * the x it wrote (a recompute's), in f32 so without it too, and in f32 its sums the
 * separate adds'. The stream in x's dtype (a bf16 residual, read only): the check case on
 * the same kernels, in place over x and dx too, and bit for bit the f32 mode with
 * norm_of_x on the widened stream (x, y, rstd, dx, dweight), the residual never written.
 * An f32 weight beside bf16 x (rms_norm.h, issue 17's parity: bf16 training's
 * f32 master weight): the check case on shapes that take each kernel path, plain,
 * Gemma's offset, dx over dy and the residual mode, dweight an f32 sum (2e-5, far inside
 * a bf16 rounding's 2e-3); a weight of a third dtype or a dweight not of the weight's
 * refused by name. RoPE after the norm (rms_norm.h's rope, on the short kernels): the
 * harness's rope case against RoPE's float64 oracle at the same tolerances; bit for bit the
 * fused row and then the CUDA fused RoPE (y, rstd, dx, dweight; i64 and i32 ids); rows the
 * short kernels cannot pair refused with rope named; an id out of range NaN in its token's
 * rows only. Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"
#include "ops/rms_norm/check.h"
#include "ops/rms_norm/reference.h"

typedef struct {
    int64_t rows, n;
    int weight, inplace, misalign;
    float offset;
} rcase;

/* The CPU harness's tolerance (check.h), twice it for an f32 dweight summed over up to
 * 4099 rows. */
static double tol(const lk_impl *impl, lk_dtype dt, int dw) {
    return lk_rms_norm_tol(impl, dt) * (dw && dt == LK_F32 ? 2.0 : 1.0);
}

static void run_case(const lk_impl *impl, lk_dtype dt, const rcase *c, uint32_t seed) {
    int64_t rows = c->rows, n = c->n, tn = rows * n, s2[2] = {rows, n};
    size_t es = lk_dtype_size(dt);
    double *x = lkt_alloc(tn + 1), *w = lkt_alloc(n), *dy = lkt_alloc(tn + 1);
    lkt_randn(x, tn + 1, &seed, 1.0);
    lkt_randn(w, n, &seed, 0.5);
    lkt_randn(dy, tn + 1, &seed, 1.0);
    /* misalign: views start one element into their buffers (no 16-byte accesses) */
    int m = c->misalign;
    char *dx_ = lkt_upload(x, tn + 1, dt), *ddy = lkt_upload(dy, tn + 1, dt);
    void *dw_ = lkt_upload(w, n, dt);
    char *dyv = lkt_dev((size_t)(tn + 1) * es), *ddx = c->inplace ? ddy : lkt_dev((size_t)(tn + 1) * es);
    void *ddw = lkt_dev((size_t)n * es);
    lkt_poison(dyv, (size_t)(tn + 1) * es);
    lkt_poison(ddw, (size_t)n * es);
    if (!c->inplace) lkt_poison(ddx, (size_t)(tn + 1) * es);
    size_t saved = 0;
    lk_tensor xt = lkt_view(dx_ + m * es, dt, 2, s2);
    assert_int_equal(lk_rms_norm_saved_bytes(impl, &xt, &saved), LK_OK);
    lk_rms_norm_args a = {
        .x = xt, .weight = lkt_view(c->weight ? dw_ : NULL, dt, 1, &n), .y = lkt_view(dyv + m * es, dt, 2, s2),
        .dy = lkt_view(ddy + m * es, dt, 2, s2), .dx = lkt_view(ddx + m * es, dt, 2, s2),
        .dweight = lkt_view(c->weight ? ddw : NULL, dt, 1, &n), .saved = {lkt_dev(saved), saved},
        .eps = 1e-6, .weight_offset = c->offset, .inplace_dx = c->inplace,
    };
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_rms_norm_forward(impl, &a, &ctx), LK_OK);
    assert_int_equal(lk_rms_norm_backward(impl, &a, &ctx), LK_OK);

    double *ry = lkt_alloc(tn), *rdx = lkt_alloc(tn), *rdw = lkt_alloc(n), *out = lkt_alloc(tn);
    const double *wr = c->weight ? w : NULL;
    lk_rms_norm_ref_forward(x + m, wr, c->offset, 1e-6, rows, n, ry, NULL);
    lk_rms_norm_ref_backward(x + m, wr, c->offset, 1e-6, dy + m, rows, n, rdx, c->weight ? rdw : NULL);
    double e;
    lkt_download(dyv + m * es, tn, dt, out);
    e = lkt_rel_err(out, ry, tn);
    print_message("  %-10s %-4s %5lldx%-6lld w%d off%.0f inplace%d mis%d: y %.2e", impl->name, lk_dtype_name(dt),
                  (long long)rows, (long long)n, c->weight, (double)c->offset, c->inplace, m, e);
    assert_true(e <= tol(impl, dt, 0));
    lkt_download(ddx + m * es, tn, dt, out);
    e = lkt_rel_err(out, rdx, tn);
    print_message(" dx %.2e", e);
    assert_true(e <= tol(impl, dt, 0));
    if (c->weight) {
        lkt_download(ddw, n, dt, out);
        e = lkt_rel_err(out, rdw, n);
        print_message(" dw %.2e", e);
        assert_true(e <= tol(impl, dt, 1));
    }
    print_message("\n");
    lk_arena_free(&arena);
}

static const rcase cases[] = {
    {64, 4096, 1, 0, 0, 0.0f},      /* register path, 16-byte accesses */
    {33, 4096, 1, 1, 0, 1.0f},      /* dx over dy, Gemma's offset */
    {4099, 1024, 1, 0, 0, 0.0f},    /* more rows than the backward grid: blocks walk rows */
    {17, 8, 0, 0, 0, 0.0f},         /* one access per row, no weight */
    {29, 4097, 1, 0, 0, 0.0f},      /* odd length: scalar, looped (too long for registers) */
    {31, 1000, 1, 0, 1, 0.0f},      /* unaligned views: scalar register path */
    {7, 13, 1, 0, 0, 0.0f},
    {3, 40000, 1, 0, 0, 0.0f},      /* too long for registers even with 16-byte accesses */
    {5, 16384, 1, 0, 0, 0.0f},      /* the longest register row in bf16 */
    {7, 4096, 1, 0, 0, 0.0f},       /* forward a warp a row: 16 accesses a lane, rows not a multiple of 4 */
    {6, 2048, 0, 0, 0, 0.0f},       /* warp a row, no weight (f32: 16 accesses, bf16: 8) */
    {5, 520, 1, 1, 0, 1.0f},        /* warp a row with idle lanes on the last access */
    {9, 301, 1, 0, 0, 0.0f},        /* odd length: the warp kernel's scalar path */
    {4099, 128, 1, 0, 0, 0.0f},     /* short rows, a group of lanes a row (bf16 16 lanes, f32 32); more
                                     * rows than the backward grid */
    {37, 64, 0, 1, 0, 0.0f},        /* short, no weight, dx over dy */
    {37, 24, 1, 0, 0, 1.0f},        /* short with idle lanes in each group, Gemma's offset */
    {1, 16, 1, 0, 0, 0.0f},         /* one row of two accesses (bf16) */
};

/* The cases reach every kernel of fused.cu: the short rows' lane groups (2-32 accesses a
 * row), the forward's warp a row (rows of 2-16 accesses a lane), the block register
 * kernels (shorter and longer rows: 8, 16384) and the looped ones (40000; 4097 with
 * scalar accesses). */
static void every_impl_dtype_shape(void **state) {
    (void)state;
    const char *names[] = {"fused", "eager_fp32"};
    for (int k = 0; k < 2; k++) {
        const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, names[k], LK_DEVICE_CUDA);
        assert_non_null(impl);
        for (int d = 0; d < 2; d++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
                run_case(impl, d ? LK_BF16 : LK_F32, &cases[i], 1234u + (uint32_t)i);
                lkt_free_all();
            }
    }
}

/* Every CUDA row (fused, eager_fp32) on each shape and case against the float64 reference
 * (check.h), f32 and bf16, seeds from seed0: y, dx and the residual within the dtype's
 * tolerance, dweight within dw_tol (< 0: the same tolerance). */
static void check_cases(const lk_shape *shapes, size_t n_shapes, const lk_rms_norm_case *cs, const char *const *labels,
                        size_t n_cs, uint32_t seed0, double dw_tol) {
    const char *names[] = {"fused", "eager_fp32"};
    for (int k = 0; k < 2; k++) {
        const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, names[k], LK_DEVICE_CUDA);
        assert_non_null(impl);
        for (int d = 0; d < 2; d++)
            for (size_t i = 0; i < n_shapes; i++)
                for (size_t c = 0; c < n_cs; c++) {
                    lk_dtype dt = d ? LK_BF16 : LK_F32;
                    lk_check_row row;
                    lk_rms_norm_errors e;
                    lk_status st = lk_rms_norm_check_case(impl, dt, &shapes[i], seed0 + i, &cs[c], &row, &e);
                    if (st) print_error("%s\n", lk_last_error());
                    assert_int_equal(st, LK_OK);
                    double t = tol(impl, dt, 1);
                    print_message("  %-10s %-4s %-9s %s: y %.2e dx %.2e dw %.2e res %.2e\n", impl->name,
                                  lk_dtype_name(dt), row.shape, labels[c], e.y, e.dx, e.dweight, e.residual);
                    assert_true(e.y <= t && e.dx <= t && e.residual <= t);
                    assert_true(e.dweight <= (dw_tol < 0 ? t : dw_tol));
                }
    }
}

/* The fused row on each shape with cs[0] (f32 and bf16) and cs[1] (its f32-weight twin, bf16
 * only) against the float64 reference, seeds from seed0: y, dx and dweight within the dtype's
 * tolerance (check.h's, as above). */
static void fused_cases(const lk_impl *impl, const lk_shape *shapes, size_t n_shapes, const lk_rms_norm_case cs[2],
                        const char *label, uint32_t seed0) {
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < n_shapes; i++)
            for (size_t c = 0; c < 2; c++) {
                lk_dtype dt = d ? LK_BF16 : LK_F32;
                if (cs[c].f32_weight && dt == LK_F32) continue;
                lk_check_row row;
                lk_rms_norm_errors e;
                lk_status st = lk_rms_norm_check_case(impl, dt, &shapes[i], seed0 + (uint32_t)i, &cs[c], &row, &e);
                if (st) print_error("%s\n", lk_last_error());
                assert_int_equal(st, LK_OK);
                double t = tol(impl, dt, 1);
                print_message("  fused %-4s %-12s %s%s: y %.2e dx %.2e dw %.2e\n", lk_dtype_name(dt), row.shape, label,
                              cs[c].f32_weight ? ", f32 weight" : "", e.y, e.dx, e.dweight);
                assert_true(e.y <= t && e.dx <= t && e.dweight <= t);
            }
}

/* The residual modes' shapes, each forward kernel: the warp a row (7x4096, 5x520 with idle
 * lanes), the block register kernel (17x8, 64x200), the looped one (3x40000, 29x4097 scalar),
 * odd lengths (9x301, 7x13), more rows than the backward grid (4099x1024). */
static const lk_shape residual_shapes[] = {{2, {7, 4096}}, {2, {5, 520}}, {2, {17, 8}}, {2, {64, 200}},
                                           {2, {3, 40000}}, {2, {29, 4097}}, {2, {9, 301}}, {2, {7, 13}},
                                           {2, {4099, 1024}}};
#define N_RESIDUAL_SHAPES (sizeof residual_shapes / sizeof *residual_shapes)

/* The residual mode on residual_shapes. */
static void residual_mode_matches_reference(void **state) {
    (void)state;
    const lk_rms_norm_case cs[] = {{.residual = 1}, {.residual = 1, .no_delta = 1}, {.residual = 1, .inplace_dx = 1},
                                   {.residual = 1, .norm_of_x = 1}};
    const char *const labels[] = {"residual", "residual (no delta)", "residual (inplace)", "residual (norm_of_x)"};
    check_cases(residual_shapes, N_RESIDUAL_SHAPES, cs, labels, sizeof cs / sizeof *cs, 900, -1);
}

/* The stream in x's dtype (residual 2: bf16; f32 runs the f32 mode) on residual_shapes:
 * plain, no delta, in place over x and dx (as the model passes them), with an f32 weight
 * in place. */
static void stream_in_x_matches_reference(void **state) {
    (void)state;
    const lk_rms_norm_case cs[] = {{.residual = 2}, {.residual = 2, .no_delta = 1},
                                   {.residual = 2, .residual_in_place = 1},
                                   {.residual = 2, .residual_in_place = 1, .f32_weight = 1}};
    const char *const labels[] = {"bf16 stream", "bf16 stream (no delta)", "bf16 stream (in place)",
                                  "bf16 stream (in place, f32 weight)"};
    check_cases(residual_shapes, N_RESIDUAL_SHAPES, cs, labels, sizeof cs / sizeof *cs, 970, -1);
}

/* The stream in x's dtype is the f32 mode on its widened values with norm_of_x, bit for
 * bit: x, y, rstd, dx and dweight; the bf16 residual never written (in place: it is x,
 * then dx). Every forward kernel: the warp a row, the block register, the looped ones, the
 * scalar, more rows than the backward grid; an f32 weight. */
static void stream_in_x_is_the_f32_mode_rounded(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{7, 4096}, {5, 520}, {64, 200}, {3, 40000}, {29, 4097}, {9, 301}, {4099, 1024}};
    const char *names[] = {"fused", "eager_fp32"};
    for (int in_place = 0; in_place <= 1; in_place++)
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
                const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, names[k], LK_DEVICE_CUDA);
                const lk_dtype dt = LK_BF16;
                int64_t rows = shapes[i][0], n = shapes[i][1], tn = rows * n, s2[2] = {rows, n};
                size_t tb = (size_t)tn * 2, wb = (size_t)n * 4;
                uint32_t seed = 91u + (uint32_t)i;
                double *h = lkt_alloc(tn), *w = lkt_alloc(n), *r0 = lkt_alloc(tn), *dl = lkt_alloc(tn), *g0 = lkt_alloc(tn);
                lkt_randn(r0, tn, &seed, 1.0);
                lkt_randn(dl, tn, &seed, 0.5);
                lkt_randn(w, n, &seed, 0.5);
                lkt_randn(h, tn, &seed, 1.0);
                lkt_randn(g0, tn, &seed, 1.0);
                for (int64_t e = 0; e < tn; e++)   /* the streams' values in bf16, so the f32 copies widen them */
                    r0[e] = lk_bf16_to_f32(lk_f32_to_bf16((float)r0[e])), g0[e] = lk_bf16_to_f32(lk_f32_to_bf16((float)g0[e]));
                void *rf = lkt_upload(r0, tn, LK_F32), *gf = lkt_upload(g0, tn, LK_F32);
                void *rb = lkt_upload(r0, tn, dt), *gb = lkt_upload(g0, tn, dt);
                void *delta = lkt_upload(dl, tn, dt), *wd = lkt_upload(w, n, LK_F32), *dy = lkt_upload(h, tn, dt);
                void *x[2] = {lkt_dev(tb), lkt_dev(tb)}, *y[2] = {lkt_dev(tb), lkt_dev(tb)};
                void *dx[2] = {lkt_dev(tb), lkt_dev(tb)}, *dw[2] = {lkt_dev(wb), lkt_dev(wb)};
                size_t sb = 0;
                lk_tensor xt = lkt_view(x[0], dt, 2, s2);
                assert_int_equal(lk_rms_norm_saved_bytes(impl, &xt, &sb), LK_OK);
                void *sv[2] = {lkt_dev(sb), lkt_dev(sb)};
                lk_arena arena = {.device = LK_DEVICE_CUDA};
                lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
                for (int side = 0; side < 2; side++) {   /* 0: the f32 mode, norm_of_x; 1: the bf16 stream */
                    lkt_poison(x[side], tb), lkt_poison(y[side], tb), lkt_poison(dx[side], tb);
                    lkt_poison(dw[side], wb), lkt_poison(sv[side], sb);
                    lk_rms_norm_args a = {.x = lkt_view(x[side], dt, 2, s2), .weight = lkt_view(wd, LK_F32, 1, &n),
                                          .y = lkt_view(y[side], dt, 2, s2), .dy = lkt_view(dy, dt, 2, s2),
                                          .dx = lkt_view(dx[side], dt, 2, s2), .dweight = lkt_view(dw[side], LK_F32, 1, &n),
                                          .saved = {sv[side], sb}, .eps = 1e-6, .delta = lkt_view(delta, dt, 2, s2),
                                          .norm_of_x = !side};
                    if (side && in_place) assert_int_equal(cudaMemcpy(x[1], rb, tb, cudaMemcpyDeviceToDevice), cudaSuccess);
                    a.residual = !side ? lkt_view(rf, LK_F32, 2, s2) : in_place ? a.x : lkt_view(rb, dt, 2, s2);
                    assert_int_equal(lk_rms_norm_forward(impl, &a, &ctx), LK_OK);
                    if (side && in_place) assert_int_equal(cudaMemcpy(dx[1], gb, tb, cudaMemcpyDeviceToDevice), cudaSuccess);
                    a.residual = !side ? lkt_view(gf, LK_F32, 2, s2) : in_place ? a.dx : lkt_view(gb, dt, 2, s2);
                    assert_int_equal(lk_rms_norm_backward(impl, &a, &ctx), LK_OK);
                }
                assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
                size_t big = tb > sb ? (tb > wb ? tb : wb) : (sb > wb ? sb : wb);
                unsigned char *b1 = malloc(big), *b2 = malloc(big);
                void *const pairs[][2] = {{x[0], x[1]}, {y[0], y[1]}, {sv[0], sv[1]}, {dx[0], dx[1]}, {dw[0], dw[1]}};
                const size_t bytes[] = {tb, tb, sb, tb, wb};
                for (int q = 0; q < 5; q++) {
                    assert_int_equal(cudaMemcpy(b1, pairs[q][0], bytes[q], cudaMemcpyDeviceToHost), cudaSuccess);
                    assert_int_equal(cudaMemcpy(b2, pairs[q][1], bytes[q], cudaMemcpyDeviceToHost), cudaSuccess);
                    assert_memory_equal(b1, b2, bytes[q]);
                }
                double *back = lkt_alloc(tn);   /* the bf16 streams as they were */
                lkt_download(rb, tn, dt, back);
                for (int64_t e = 0; e < tn; e++) assert_true(back[e] == r0[e]);
                lkt_download(gb, tn, dt, back);
                for (int64_t e = 0; e < tn; e++) assert_true(back[e] == g0[e]);
                print_message("  %-10s bf16 %5lldx%-5lld stream%s: x, y, rstd, dx, dweight the f32 mode's bits\n",
                              impl->name, (long long)rows, (long long)n, in_place ? " in place" : "");
                free(b1); free(b2);
                lk_arena_free(&arena);
                lkt_free_all();
            }
}

/* An f32 weight beside bf16 x (and beside f32 x: the plain case), every kernel: the warp a
 * row (7x4096, 5x520), the block register kernels (17x8, 64x200, 5x16384), the looped ones
 * (3x40000, 29x4097 scalar), odd lengths (9x301, 7x13), more rows than the backward grid
 * (4099x1024); plain, offset 1, dx over dy, residual. */
static void f32_weight_matches_reference(void **state) {
    (void)state;
    static const lk_shape shapes[] = {{2, {7, 4096}}, {2, {5, 520}}, {2, {17, 8}}, {2, {64, 200}},
                                      {2, {5, 16384}}, {2, {3, 40000}}, {2, {29, 4097}}, {2, {9, 301}},
                                      {2, {7, 13}}, {2, {4099, 1024}}};
    const lk_rms_norm_case cs[] = {
        {.f32_weight = 1}, {.f32_weight = 1, .weight_offset = 1.0f}, {.f32_weight = 1, .inplace_dx = 1},
        {.f32_weight = 1, .residual = 1}, {.f32_weight = 1, .residual = 1, .no_delta = 1},
    };
    const char *const labels[] = {"f32 weight", "f32 weight, offset 1", "f32 weight, inplace",
                                  "f32 weight, residual", "f32 weight, residual (no delta)"};
    /* dweight: an f32 sum, no bf16 rounding on the way */
    check_cases(shapes, sizeof shapes / sizeof *shapes, cs, labels, sizeof cs / sizeof *cs, 950, 2e-5);
}

/* Strided views (rms_norm.h; q_norm / k_norm of a decoder read token-major heads and write
 * them head-major): the fused row on every kernel, the warp a row (9x16x128: a 0.6B's q
 * heads, a row of 16 accesses a block's; 5x3x520 a warp's), the block register kernels
 * (17x2x8, 7x3x200), the looped ones (2x2x40000, 3x2x4097 scalar), more rows than the
 * backward grid (4099x2x64);
 * plain and with an f32 weight; dx's gaps untouched; and with y and dy contiguous beside the
 * strided x and dx (views 2: the short kernels' rows of unlike layouts, rows_at a view).
 * eager_fp32 refuses them. */
static void views_match_reference(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    assert_non_null(impl);
    assert_true(lk_rms_norm_takes_views(impl));
    static const lk_shape shapes[] = {{3, {9, 16, 128}}, {3, {5, 3, 520}}, {3, {17, 2, 8}}, {3, {7, 3, 200}},
                                      {3, {2, 2, 40000}}, {3, {3, 2, 4097}}, {3, {4099, 2, 64}}};
    const lk_rms_norm_case cs[] = {{.views = 1}, {.views = 1, .f32_weight = 1}};
    fused_cases(impl, shapes, sizeof shapes / sizeof *shapes, cs, "views", 970);
    const lk_rms_norm_case cc[] = {{.views = 2}, {.views = 2, .f32_weight = 1}};
    fused_cases(impl, shapes, sizeof shapes / sizeof *shapes, cc, "views 2", 1040);
    const lk_impl *eager = lk_impl_find(LK_OP_RMS_NORM, "eager_fp32", LK_DEVICE_CUDA);
    assert_non_null(eager);
    assert_false(lk_rms_norm_takes_views(eager));
    lk_check_row row;
    assert_int_equal(lk_rms_norm_check_case(eager, LK_F32, &shapes[0], 990, &cs[0], &row, NULL), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "takes contiguous tensors"));
}

/* A weight neither x's dtype nor f32, or a dweight not of the weight's dtype: refused by
 * name before anything runs (the facade's rule; the CUDA rows see only the two pairs). */
static void f32_weight_bad_dtypes_refused(void **state) {
    (void)state;
    int64_t s2[2] = {4, 8}, n = 8;
    char *d = lkt_dev(4096);
    void *saved = lkt_dev(64);
    const char *names[] = {"fused", "eager_fp32"};
    for (int k = 0; k < 2; k++) {
        const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, names[k], LK_DEVICE_CUDA);
        lk_rms_norm_args a = {.x = lkt_view(d, LK_BF16, 2, s2), .y = lkt_view(d + 256, LK_BF16, 2, s2),
                              .dy = lkt_view(d + 512, LK_BF16, 2, s2), .dx = lkt_view(d + 768, LK_BF16, 2, s2),
                              .weight = lkt_view(d + 1024, LK_F16, 1, &n), .dweight = lkt_view(d + 1280, LK_F16, 1, &n),
                              .saved = {saved, 64}, .eps = 1e-6};
        lk_arena arena = {.device = LK_DEVICE_CUDA};
        lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
        assert_int_equal(lk_rms_norm_forward(impl, &a, &ctx), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "weight"));
        assert_int_equal(lk_rms_norm_backward(impl, &a, &ctx), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "weight"));
        a.weight.dtype = LK_F32;                        /* f32 weight, bf16 dweight */
        a.dweight.dtype = LK_BF16;
        assert_int_equal(lk_rms_norm_backward(impl, &a, &ctx), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "dweight"));
        a.x.dtype = a.y.dtype = a.dy.dtype = a.dx.dtype = LK_F32;   /* f32 x, bf16 weight */
        a.weight.dtype = a.dweight.dtype = LK_BF16;
        assert_int_equal(lk_rms_norm_forward(impl, &a, &ctx), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "weight"));
        lk_arena_free(&arena);
    }
    lkt_free_all();
}

/* With norm_of_x the residual forward's y and rstd are the plain forward's on the x it
 * wrote, bit for bit (the model's recompute runs the plain one); without it too in f32
 * (x is the stream), while in bf16 y is another (the stream's norm). In f32 the stream's
 * sums and x are the separate f32 adds, and the backward's residual is res + the plain
 * backward's dx (the plain backward on the residual forward's rstd: the backward reads
 * only x and rstd). */
static void residual_mode_is_the_plain_norm_of_x(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{7, 4096}, {64, 200}, {3, 40000}, {9, 301}, {33, 1024}};
    const char *names[] = {"fused", "eager_fp32"};
    for (int of_x = 0; of_x <= 1; of_x++)
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < 2; d++)
            for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
                const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, names[k], LK_DEVICE_CUDA);
                lk_dtype dt = d ? LK_BF16 : LK_F32;
                int64_t rows = shapes[i][0], n = shapes[i][1], tn = rows * n, s2[2] = {rows, n};
                size_t es = lk_dtype_size(dt), tb = (size_t)tn * es;
                uint32_t seed = 77u + (uint32_t)i;
                double *h = lkt_alloc(tn), *w = lkt_alloc(n), *r0 = lkt_alloc(tn), *dl = lkt_alloc(tn);
                double *g0 = lkt_alloc(tn);
                lkt_randn(r0, tn, &seed, 1.0);
                lkt_randn(dl, tn, &seed, 0.5);
                lkt_randn(w, n, &seed, 0.5);
                lkt_randn(h, tn, &seed, 1.0);
                lkt_randn(g0, tn, &seed, 1.0);
                float *res = lkt_upload(r0, tn, LK_F32), *gres = lkt_upload(g0, tn, LK_F32);
                void *delta = lkt_upload(dl, tn, dt), *wd = lkt_upload(w, n, dt), *dy = lkt_upload(h, tn, dt);
                void *x = lkt_dev(tb), *y1 = lkt_dev(tb), *y2 = lkt_dev(tb), *dx1 = lkt_dev(tb), *dx2 = lkt_dev(tb);
                lkt_poison(x, tb);
                size_t sb = 0;
                lk_tensor xt = lkt_view(x, dt, 2, s2);
                assert_int_equal(lk_rms_norm_saved_bytes(impl, &xt, &sb), LK_OK);
                void *sv1 = lkt_dev(sb), *sv2 = lkt_dev(sb);
                lk_rms_norm_args a = {.x = xt, .weight = lkt_view(wd, dt, 1, &n), .y = lkt_view(y1, dt, 2, s2),
                                      .dy = lkt_view(dy, dt, 2, s2), .dx = lkt_view(dx1, dt, 2, s2),
                                      .saved = {sv1, sb}, .eps = 1e-6,
                                      .residual = lkt_view(res, LK_F32, 2, s2), .delta = lkt_view(delta, dt, 2, s2),
                                      .norm_of_x = of_x};
                lk_arena arena = {.device = LK_DEVICE_CUDA};
                lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
                assert_int_equal(lk_rms_norm_forward(impl, &a, &ctx), LK_OK);
                a.residual.data = gres;
                assert_int_equal(lk_rms_norm_backward(impl, &a, &ctx), LK_OK);
                lk_rms_norm_args p = a;                      /* plain, on the written x */
                p.residual = p.delta = (lk_tensor){0};
                p.norm_of_x = 0;
                p.y.data = y2, p.saved.data = sv2, p.dx.data = dx2;
                assert_int_equal(lk_rms_norm_forward(impl, &p, &ctx), LK_OK);
                p.saved.data = sv1;                          /* the residual forward's rstd */
                assert_int_equal(lk_rms_norm_backward(impl, &p, &ctx), LK_OK);
                assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
                unsigned char *b1 = malloc(tb > sb ? tb : sb), *b2 = malloc(tb > sb ? tb : sb);
                assert_int_equal(cudaMemcpy(b1, y1, tb, cudaMemcpyDeviceToHost), cudaSuccess);
                assert_int_equal(cudaMemcpy(b2, y2, tb, cudaMemcpyDeviceToHost), cudaSuccess);
                int same = of_x || dt == LK_F32;
                if (same) assert_memory_equal(b1, b2, tb);
                else assert_memory_not_equal(b1, b2, tb);   /* the stream's norm */
                assert_int_equal(cudaMemcpy(b1, sv1, sb, cudaMemcpyDeviceToHost), cudaSuccess);
                assert_int_equal(cudaMemcpy(b2, sv2, sb, cudaMemcpyDeviceToHost), cudaSuccess);
                if (same) assert_memory_equal(b1, b2, sb);
                /* x and the forward's sum; the backward's residual against res + the plain dx */
                double *xs = lkt_alloc(tn), *rs = lkt_alloc(tn), *gs = lkt_alloc(tn), *pdx = lkt_alloc(tn),
                       *rdx = lkt_alloc(tn);
                lkt_download(x, tn, dt, xs);
                lkt_download(res, tn, LK_F32, rs);
                lkt_download(gres, tn, LK_F32, gs);
                lkt_download(dx2, tn, dt, pdx);
                lkt_download(dx1, tn, dt, rdx);
                double worst = 0;
                for (int64_t e = 0; e < tn; e++) {
                    float sum = (float)r0[e] + (float)dl[e];   /* r0, dl: rounded to f32 / dt by the uploads */
                    assert_true(rs[e] == (double)sum);
                    if (dt == LK_F32) {
                        assert_true(xs[e] == (double)sum);
                        assert_true(gs[e] == (double)((float)g0[e] + (float)pdx[e]));   /* the separate add */
                        assert_true(rdx[e] == gs[e]);
                    } else {
                        assert_true(xs[e] == (double)lk_bf16_to_f32(lk_f32_to_bf16(sum)));
                        assert_true(rdx[e] == (double)lk_bf16_to_f32(lk_f32_to_bf16((float)gs[e])));
                        worst = fmax(worst, fabs(gs[e] - (g0[e] + pdx[e])) / (fabs(pdx[e]) + 1e-3));
                    }
                }
                print_message("  %-10s %-4s %5lldx%-6lld%s residual %s the plain norm of x; bf16 stream vs rounded dx "
                              "%.2e\n", impl->name, lk_dtype_name(dt), (long long)rows, (long long)n,
                              of_x ? " norm_of_x" : "", same ? "=" : "!=", worst);
                assert_true(worst <= 1e-2);   /* the f32 dx against its bf16 rounding: 2^-9 of dx */
                free(b1); free(b2);
                lk_arena_free(&arena);
                lkt_free_all();
            }
}

/* The norm reads the f32 stream (issue 17): bf16 x, an f32 weight, y the bf16 rounding
 * of the exact norm of the stream for all but the rare element within an f32 ulp of a
 * tie (the CPU rows: 65535 of 65536), on each forward kernel: the warp a row (7x4096,
 * 64x1024), the block register kernel (17x8, 5x16384), the looped one (3x40000, 29x4097
 * scalar); with norm_of_x (x off the stream by up to 2^-9) fewer (the CPU rows: 74%).
 * The tolerances of the check case cannot tell the two apart. */
static void residual_norm_reads_the_stream(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{7, 4096}, {64, 1024}, {17, 8}, {5, 16384}, {3, 40000}, {29, 4097}};
    const char *names[] = {"fused", "eager_fp32"};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int of_x = 0; of_x <= 1; of_x++) {
                const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, names[k], LK_DEVICE_CUDA);
                int64_t rows = shapes[i][0], n = shapes[i][1], tn = rows * n, s2[2] = {rows, n};
                uint32_t seed = 91u + (uint32_t)i;
                double *r0 = lkt_alloc(tn), *dl = lkt_alloc(tn), *w = lkt_alloc(n), *sd = lkt_alloc(tn),
                       *ref = lkt_alloc(tn), *out = lkt_alloc(tn);
                lkt_randn(r0, tn, &seed, 1.0);
                lkt_randn(dl, tn, &seed, 0.5);
                lkt_randn(w, n, &seed, 0.2);
                for (int64_t j = 0; j < n; j++) w[j] += 1.0;
                float *res = lkt_upload(r0, tn, LK_F32);   /* r0, dl, w: rounded to f32 / bf16 / f32 in place */
                void *delta = lkt_upload(dl, tn, LK_BF16), *wd = lkt_upload(w, n, LK_F32);
                for (int64_t e = 0; e < tn; e++) sd[e] = (double)((float)r0[e] + (float)dl[e]);   /* the f32 add */
                void *x = lkt_dev((size_t)tn * 2), *y = lkt_dev((size_t)tn * 2);
                lkt_poison(x, (size_t)tn * 2);
                lkt_poison(y, (size_t)tn * 2);
                size_t sb = 0;
                lk_tensor xt = lkt_view(x, LK_BF16, 2, s2);
                assert_int_equal(lk_rms_norm_saved_bytes(impl, &xt, &sb), LK_OK);
                lk_rms_norm_args a = {.x = xt, .weight = lkt_view(wd, LK_F32, 1, &n), .y = lkt_view(y, LK_BF16, 2, s2),
                                      .saved = {lkt_dev(sb), sb}, .eps = 1e-6,
                                      .residual = lkt_view(res, LK_F32, 2, s2), .delta = lkt_view(delta, LK_BF16, 2, s2),
                                      .norm_of_x = of_x};
                lk_arena arena = {.device = LK_DEVICE_CUDA};
                lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
                assert_int_equal(lk_rms_norm_forward(impl, &a, &ctx), LK_OK);
                lk_rms_norm_ref_forward(sd, w, 0.0, 1e-6, rows, n, ref, NULL);
                lkt_download(y, tn, LK_BF16, out);
                int64_t hit = 0;
                for (int64_t e = 0; e < tn; e++) hit += out[e] == (double)lk_bf16_to_f32(lk_f32_to_bf16((float)ref[e]));
                print_message("  %-10s bf16 %5lldx%-6lld %s: y the rounding of the exact norm of the stream: %lld of "
                              "%lld\n", impl->name, (long long)rows, (long long)n, of_x ? "norm_of_x " : "the stream",
                              (long long)hit, (long long)tn);
                if (of_x) assert_true(hit < tn * 95 / 100);
                else assert_true(hit >= tn * 99 / 100);
                lk_arena_free(&arena);
                lkt_free_all();
            }
}

/* No rows: the facade hands the call to the implementation, which zeroes dweight. */
static void zero_rows_zero_dweight(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    int64_t n = 64, s2[2] = {0, n};
    double *w = lkt_alloc(n), *out = lkt_alloc(n);
    uint32_t seed = 5;
    lkt_randn(w, n, &seed, 1.0);
    void *dw = lkt_dev(n * 4), *wd = lkt_upload(w, n, LK_F32), *nothing = lkt_dev(64);
    lkt_poison(dw, n * 4);
    lk_rms_norm_args a = {
        .x = lkt_view(nothing, LK_F32, 2, s2), .weight = lkt_view(wd, LK_F32, 1, &n),
        .dy = lkt_view(nothing, LK_F32, 2, s2), .dx = lkt_view((char *)nothing + 32, LK_F32, 2, s2),
        .dweight = lkt_view(dw, LK_F32, 1, &n), .eps = 1e-6,
    };
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_rms_norm_backward(impl, &a, &ctx), LK_OK);
    lkt_download(dw, n, LK_F32, out);
    for (int64_t j = 0; j < n; j++) assert_true(out[j] == 0.0);
    lk_arena_free(&arena);
    lkt_free_all();
}

/* A CPU tensor, or a CPU context, handed to a CUDA implementation is refused by name. */
static void device_mismatch_refused(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    int64_t s2[2] = {4, 8}, n = 8;
    void *d = lkt_dev(4 * 8 * 4 * 3);
    float rstd[4];
    lk_rms_norm_args a = {.x = lkt_view(d, LK_F32, 2, s2), .y = lkt_view((char *)d + 128, LK_F32, 2, s2),
                          .saved = {rstd, sizeof rstd}, .eps = 1e-6};
    a.weight = lkt_view(NULL, LK_F32, 1, &n);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0), cpu = lk_ctx_cpu(&arena);
    assert_int_equal(lk_rms_norm_forward(impl, &a, &cpu), LK_EDEVICE);
    assert_non_null(strstr(lk_last_error(), "ctx.device"));
    a.y.device.type = LK_DEVICE_CPU;
    assert_int_equal(lk_rms_norm_forward(impl, &a, &ctx), LK_EDEVICE);
    assert_non_null(strstr(lk_last_error(), "y"));
    lkt_free_all();
}

/* RoPE after the norm (rms_norm.h's rope) on the fused row: the harness's rope case (y
 * rotated, dy rotated back, against RoPE's float64 oracle over the norm's) on the views the
 * model passes, f32 and bf16 (and bf16 with an f32 weight), on the short kernels' lane
 * groups: 16 lanes a row (128 bf16; f32 32), 8 (64 bf16), 2 (16 bf16; f32 4), more rows
 * than the backward grid holds at once (1000x16x128). eager_fp32 does not rotate. */
static void rope_matches_reference(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    assert_non_null(impl);
    assert_true(lk_rms_norm_takes_rope(impl));
    assert_false(lk_rms_norm_takes_rope(lk_impl_find(LK_OP_RMS_NORM, "eager_fp32", LK_DEVICE_CUDA)));
    /* the rows it pairs, as the model asks before it passes rope (else RoPE runs on its own) */
    assert_true(lk_rms_norm_takes_rope_rows(impl, 128, LK_BF16) && lk_rms_norm_takes_rope_rows(impl, 16, LK_BF16));
    assert_true(lk_rms_norm_takes_rope_rows(impl, 128, LK_F32) && lk_rms_norm_takes_rope_rows(impl, 8, LK_F32));
    assert_false(lk_rms_norm_takes_rope_rows(impl, 96, LK_BF16) || lk_rms_norm_takes_rope_rows(impl, 34, LK_BF16));
    assert_false(lk_rms_norm_takes_rope_rows(impl, 512, LK_BF16) || lk_rms_norm_takes_rope_rows(impl, 256, LK_F32));
    assert_false(lk_rms_norm_takes_rope_rows(impl, 8, LK_BF16) || lk_rms_norm_takes_rope_rows(impl, 4, LK_F32));
    static const lk_shape shapes[] = {{3, {29, 3, 128}}, {3, {13, 8, 64}}, {3, {1000, 16, 128}}, {3, {9, 4, 16}}};
    const lk_rms_norm_case cs[] = {{.views = 1, .rope = 1}, {.views = 1, .rope = 1, .f32_weight = 1}};
    fused_cases(impl, shapes, sizeof shapes / sizeof *shapes, cs, "rope", 1010);
    const lk_rms_norm_case cc[] = {{.views = 2, .rope = 1}, {.views = 2, .rope = 1, .f32_weight = 1}};
    fused_cases(impl, shapes, sizeof shapes / sizeof *shapes, cc, "rope, views 2", 1050);
}

/* Rows the short kernels cannot pair are refused by the fused row with rope named, each
 * pass, before anything runs: not 16-byte accesses (n = 34; an odd number of f32 pairs),
 * accesses not a power of two (bf16 48: 6; f32 24: 6), too many (bf16 512: 64 accesses). */
static void rope_unpaired_rows_refused(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    static const struct {
        lk_dtype dt;
        lk_shape shape;
    } cs[] = {{LK_BF16, {3, {5, 2, 34}}}, {LK_F32, {3, {5, 2, 34}}}, {LK_F32, {3, {3, 2, 18}}},
              {LK_BF16, {3, {5, 2, 48}}}, {LK_F32, {3, {5, 2, 24}}}, {LK_BF16, {3, {3, 2, 512}}}};
    const lk_rms_norm_case c = {.views = 1, .rope = 1};
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        lk_check_row row;
        lk_status st = lk_rms_norm_check_case(impl, cs[i].dt, &cs[i].shape, 1030 + i, &c, &row, NULL);
        print_message("  fused %-4s %-10s rope -> %s: %s\n", lk_dtype_name(cs[i].dt), row.shape, lk_status_name(st),
                      lk_last_error());
        assert_int_equal(st, LK_EINVAL);
        assert_non_null(strstr(lk_last_error(), "rms_norm: fused (cuda): rope: expected"));
    }
    lkt_free_all();
}

/* A [T, H, n] call with rope on the GPU (positions of packed documents) and its tables,
 * the layout the model passes: x and dx token-major, y and dy head-major. */
#define ROPE_MAX 64
typedef struct {
    int64_t T, H, n, all;
    lk_dtype dt, pdt;
    size_t tb, vb, sb;
    void *x, *w, *dy, *y, *dx, *dw, *sv, *y2, *k2, *dy2, *dk2, *dx2, *dw2, *sv2, *cos, *sin, *pos;
    lk_rms_norm_rope rope;
    lk_arena arena;
    lk_ctx ctx;
} grope;

static void *upload_bytes(const void *h, size_t bytes) {
    void *d = lkt_dev(bytes);
    assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void grope_init(grope *f, lk_dtype dt, lk_dtype pdt, int64_t T, int64_t H, int64_t n, uint32_t seed) {
    memset(f, 0, sizeof *f);
    f->T = T, f->H = H, f->n = n, f->all = T * H * n, f->dt = dt, f->pdt = pdt;
    f->tb = (size_t)f->all * lk_dtype_size(dt), f->vb = (size_t)n * lk_dtype_size(dt);
    double *x = lkt_alloc(f->all), *dy = lkt_alloc(f->all), *w = lkt_alloc(n);
    lkt_randn(x, f->all, &seed, 1.0);
    lkt_randn(dy, f->all, &seed, 1.0);
    lkt_randn(w, n, &seed, 0.2);
    for (int64_t j = 0; j < n; j++) w[j] += 1.0;
    f->x = lkt_upload(x, f->all, dt), f->dy = lkt_upload(dy, f->all, dt), f->w = lkt_upload(w, n, dt);
    void **outs[] = {&f->y, &f->dx, &f->y2, &f->k2, &f->dy2, &f->dk2, &f->dx2};
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) {
        *outs[i] = lkt_dev(f->tb);
        lkt_poison(*outs[i], f->tb);
    }
    f->dw = lkt_dev(f->vb), f->dw2 = lkt_dev(f->vb);
    lkt_poison(f->dw, f->vb), lkt_poison(f->dw2, f->vb);
    float *c = malloc(sizeof(float) * ROPE_MAX * (size_t)(n / 2)), *s = malloc(sizeof(float) * ROPE_MAX * (size_t)(n / 2));
    lk_tensor ct = lk_tensor_2d(c, LK_F32, ROPE_MAX, n / 2), st = lk_tensor_2d(s, LK_F32, ROPE_MAX, n / 2);
    assert_int_equal(lk_rope_tables(1e6, n, NULL, &ct, &st), LK_OK);
    f->cos = upload_bytes(c, sizeof(float) * ROPE_MAX * (size_t)(n / 2));
    f->sin = upload_bytes(s, sizeof(float) * ROPE_MAX * (size_t)(n / 2));
    free(c), free(s);
    int64_t *p64 = malloc(sizeof(int64_t) * (size_t)T);
    int32_t *p32 = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) p64[t] = p32[t] = (int32_t)(t % 11 + (t / 11) % 3);   /* documents of 11 tokens */
    f->pos = pdt == LK_I64 ? upload_bytes(p64, sizeof(int64_t) * (size_t)T) : upload_bytes(p32, sizeof(int32_t) * (size_t)T);
    free(p64), free(p32);
    f->rope = (lk_rms_norm_rope){lkt_view(f->cos, LK_F32, 2, (int64_t[]){ROPE_MAX, n / 2}),
                                 lkt_view(f->sin, LK_F32, 2, (int64_t[]){ROPE_MAX, n / 2}), lkt_view(f->pos, pdt, 1, &T)};
    lk_tensor xt = lkt_view(f->x, dt, 3, (int64_t[]){T, H, n});
    assert_int_equal(lk_rms_norm_saved_bytes(lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA), &xt, &f->sb), LK_OK);
    f->sv = lkt_dev(f->sb), f->sv2 = lkt_dev(f->sb);
    lkt_poison(f->sv, f->sb), lkt_poison(f->sv2, f->sb);
    f->arena = (lk_arena){.device = LK_DEVICE_CUDA};
    f->ctx = lk_ctx_cuda(&f->arena, NULL, 0);
}

/* [T, H, n] head-major over p: the layout the model writes q and k in, and RoPE's [1, H, T, n]. */
static lk_tensor grope_head_major(void *p, const grope *f) {
    lk_tensor t = lkt_view(p, f->dt, 3, (int64_t[]){f->T, f->H, f->n});
    t.stride[0] = f->n, t.stride[1] = f->T * f->n;
    return t;
}

static lk_rms_norm_args grope_call(grope *f, void *y, void *dy, void *dx, void *dw, void *sv, int rope) {
    return (lk_rms_norm_args){
        .x = lkt_view(f->x, f->dt, 3, (int64_t[]){f->T, f->H, f->n}), .weight = lkt_view(f->w, f->dt, 1, &f->n),
        .y = grope_head_major(y, f), .dy = grope_head_major(dy, f), .dx = lkt_view(dx, f->dt, 3, (int64_t[]){f->T, f->H, f->n}),
        .dweight = lkt_view(dw, f->dt, 1, &f->n), .saved = {sv, f->sb}, .eps = 1e-6, .rope = rope ? &f->rope : NULL,
    };
}

/* The CUDA fused RoPE over [1, H, T, n] in place on q (k a copy of q, rotated alike). */
static void grope_fused_rope(grope *f, void *q, void *k, int backward) {
    assert_int_equal(cudaMemcpy(k, q, f->tb, cudaMemcpyDeviceToDevice), cudaSuccess);
    lk_tensor tq = lkt_view(q, f->dt, 4, (int64_t[]){1, f->H, f->T, f->n}), tk = tq;
    tk.data = k;
    lk_rope_args r = {.q = tq, .k = tk, .q_out = tq, .k_out = tk, .dq_out = tq, .dk_out = tk, .dq = tq, .dk = tk,
                      .cos = f->rope.cos, .sin = f->rope.sin,
                      .position_ids = lkt_view(f->pos, f->pdt, 2, (int64_t[]){1, f->T})};
    const lk_impl *rope = lk_impl_find(LK_OP_ROPE, "fused", LK_DEVICE_CUDA);
    assert_non_null(rope);
    assert_int_equal(backward ? lk_rope_backward(rope, &r, &f->ctx) : lk_rope_forward(rope, &r, &f->ctx), LK_OK);
}

/* 1 when n bytes of two device buffers are the same. */
static int same_bits(const void *a, const void *b, size_t n) {
    unsigned char *ha = malloc(n), *hb = malloc(n);
    assert_int_equal(cudaMemcpy(ha, a, n, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(hb, b, n, cudaMemcpyDeviceToHost), cudaSuccess);
    int same = memcmp(ha, hb, n) == 0;
    free(ha), free(hb);
    return same;
}

/* The fused row with rope is the fused row and then the CUDA fused RoPE, bit for bit: y,
 * rstd, dx and dweight (rope/rotate.cuh's one formula in both kernels; the backward's grid,
 * hence dweight's order of sums, the same with and without rope), f32 and bf16, i64 and i32
 * ids, on each lane group: 16 (bf16 128), 8 (bf16 64; f32 32), 2 (bf16 16), 32 (f32 128),
 * and more rows than the backward grid holds at once (1000x16x128: a persistent grid). */
static void rope_is_norm_then_fused_rope(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    static const int64_t dims[][3] = {{29, 3, 128}, {13, 8, 64}, {1000, 16, 128}, {9, 4, 16}};
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof dims / sizeof *dims; k++) {
            grope f;
            lk_dtype pdt = k % 2 ? LK_I32 : LK_I64;
            grope_init(&f, d ? LK_BF16 : LK_F32, pdt, dims[k][0], dims[k][1], dims[k][2], 720u + (uint32_t)k);
            lk_rms_norm_args a = grope_call(&f, f.y, f.dy, f.dx, f.dw, f.sv, 1);
            assert_int_equal(lk_rms_norm_forward(impl, &a, &f.ctx), LK_OK);
            assert_int_equal(lk_rms_norm_backward(impl, &a, &f.ctx), LK_OK);
            lk_rms_norm_args b = grope_call(&f, f.y2, f.dy2, f.dx2, f.dw2, f.sv2, 0);
            assert_int_equal(lk_rms_norm_forward(impl, &b, &f.ctx), LK_OK);
            grope_fused_rope(&f, f.y2, f.k2, 0);
            assert_int_equal(cudaMemcpy(f.dy2, f.dy, f.tb, cudaMemcpyDeviceToDevice), cudaSuccess);
            grope_fused_rope(&f, f.dy2, f.dk2, 1);
            assert_int_equal(lk_rms_norm_backward(impl, &b, &f.ctx), LK_OK);
            assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
            int sy = same_bits(f.y, f.y2, f.tb), sr = same_bits(f.sv, f.sv2, f.sb), sx = same_bits(f.dx, f.dx2, f.tb),
                sw = same_bits(f.dw, f.dw2, f.vb);
            print_message("  fused + rope (cuda) %-4s %s ids [%lld, %lld, %lld]: y %s, rstd %s, dx %s, dweight %s\n",
                          lk_dtype_name(f.dt), lk_dtype_name(pdt), (long long)f.T, (long long)f.H, (long long)f.n,
                          sy ? "same bits" : "DIFFER", sr ? "same bits" : "DIFFER", sx ? "same bits" : "DIFFER",
                          sw ? "same bits" : "DIFFER");
            assert_true(sy && sr && sx && sw);
            double *out = lkt_alloc(f.all);   /* and written: no poison left */
            lkt_download(f.y, f.all, f.dt, out);
            for (int64_t e = 0; e < f.all; e++) assert_true(isfinite(out[e]));
            lkt_download(f.dx, f.all, f.dt, out);
            for (int64_t e = 0; e < f.all; e++) assert_true(isfinite(out[e]));
            lk_arena_free(&f.arena);
            lkt_free_all();
        }
}

/* Position ids are device memory the facade does not read: an id outside [0, max_pos)
 * gives NaN in that token's rows (all n dims rotate), as the CUDA fused RoPE does, and
 * nothing else changes; no read outside the tables. */
static void rope_bad_ids_give_nan(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    for (int d = 0; d < 2; d++) {
        grope f;
        grope_init(&f, d ? LK_BF16 : LK_F32, d ? LK_I32 : LK_I64, 6, 2, 64, 740);
        lk_rms_norm_args a = grope_call(&f, f.y, f.dy, f.dx, f.dw, f.sv, 1);
        assert_int_equal(lk_rms_norm_forward(impl, &a, &f.ctx), LK_OK);   /* in range: y2 */
        assert_int_equal(cudaMemcpy(f.y2, f.y, f.tb, cudaMemcpyDeviceToDevice), cudaSuccess);
        int64_t bad[] = {ROPE_MAX, -1};
        for (int b = 0; b < 2; b++) {
            size_t es = lk_dtype_size(f.pdt);
            int32_t b32 = (int32_t)bad[b];
            assert_int_equal(cudaMemcpy((char *)f.pos + 3 * es, f.pdt == LK_I64 ? (void *)&bad[b] : (void *)&b32, es,
                                        cudaMemcpyHostToDevice), cudaSuccess);
            lkt_poison(f.y, f.tb);
            assert_int_equal(lk_rms_norm_forward(impl, &a, &f.ctx), LK_OK);
            assert_int_equal(lk_rms_norm_backward(impl, &a, &f.ctx), LK_OK);
            double *y = lkt_alloc(f.all), *y2 = lkt_alloc(f.all), *dx = lkt_alloc(f.all);
            lkt_download(f.y, f.all, f.dt, y);
            lkt_download(f.y2, f.all, f.dt, y2);
            lkt_download(f.dx, f.all, f.dt, dx);
            for (int64_t h = 0; h < f.H; h++)   /* y head-major [H, T, n], dx token-major [T, H, n] */
                for (int64_t t = 0; t < f.T; t++)
                    for (int64_t j = 0; j < f.n; j++) {
                        double v = y[(h * f.T + t) * f.n + j], g = dx[(t * f.H + h) * f.n + j];
                        if (t == 3) assert_true(isnan(v) && isnan(g));
                        else assert_true(v == y2[(h * f.T + t) * f.n + j] && isfinite(g));
                    }
            print_message("  fused %-4s %s id %lld at token 3: its rows NaN, the others as before\n",
                          lk_dtype_name(f.dt), lk_dtype_name(f.pdt), (long long)bad[b]);
        }
        lk_arena_free(&f.arena);
        lkt_free_all();
    }
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_rms_norm")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_impl_dtype_shape),
        cmocka_unit_test(residual_mode_matches_reference),
        cmocka_unit_test(residual_mode_is_the_plain_norm_of_x),
        cmocka_unit_test(residual_norm_reads_the_stream),
        cmocka_unit_test(stream_in_x_matches_reference),
        cmocka_unit_test(stream_in_x_is_the_f32_mode_rounded),
        cmocka_unit_test(zero_rows_zero_dweight),
        cmocka_unit_test(device_mismatch_refused),
        cmocka_unit_test(f32_weight_matches_reference),
        cmocka_unit_test(f32_weight_bad_dtypes_refused),
        cmocka_unit_test(views_match_reference),
        cmocka_unit_test(rope_matches_reference),
        cmocka_unit_test(rope_unpaired_rows_refused),
        cmocka_unit_test(rope_is_norm_then_fused_rope),
        cmocka_unit_test(rope_bad_ids_give_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
