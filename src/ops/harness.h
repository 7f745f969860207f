/* harness.h — what `llmkern check` and `llmkern bench` (and the tests) need of an op:
 * a comparison of one implementation with the float64 reference on fresh random
 * inputs, and a timing of its passes. One lk_harness per op, named by its descriptor
 * (src/ops/op_def.h). */
#ifndef LLMKERN_HARNESS_H
#define LLMKERN_HARNESS_H

#include <stdio.h>
#include "llmkern/llmkern.h"

typedef struct {
    int ndim;
    int64_t d[LK_MAX_DIMS];
} lk_shape;

typedef struct {
    char op[32], impl[48], dtype[8], shape[64];
    double max_rel_err;     /* worst over every output: max|got - ref| / max|ref| */
    double tol;             /* for this implementation and dtype */
    int pass;
} lk_check_row;

/* A named parameter of a bench row's case beyond its shape (attention's mask=document
 * hkv=2 blk=64 density=0.079): the CLI prints name=value, and --json a member of that name. */
typedef struct {
    char name[12];
    char text[24];          /* a word, or "" when the value is the number */
    double value;
} lk_bench_param;
#define LK_BENCH_PARAMS 6

typedef struct {
    char op[32], impl[48], device[8], dtype[8], shape[64], pass[8];  /* pass: fwd, bwd, fwd+bwd */
    lk_bench_param param[LK_BENCH_PARAMS];
    int nparam;
    double ms, gbps, gflops, ceiling_fraction;
    size_t peak_bytes;      /* extra memory: saved for the backward + workspace peak */
} lk_bench_row;

typedef struct {
    double copy_gbps;       /* measured in the same run: read + write of a large buffer */
    double gemm_gflops;     /* f32 GEMM through CBLAS */
} lk_ceilings;

/* The named options of a bench case beyond its size, as the command line wrote them
 * (`llmkern bench --op attention --size 1x8x4096x64 --mask document --kv-heads 2
 * --block 64`); NULL when not given. The op's harness parses and checks them. */
typedef struct {
    const char *mask, *kv_heads, *block;
} lk_case_opts;
#define LK_CASE_MASK 1u
#define LK_CASE_KV_HEADS 2u
#define LK_CASE_BLOCK 4u

typedef struct {
    /* Runs impl forward and backward against the float64 reference on one shape. */
    lk_status (*check)(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                       lk_check_row *row);
    const lk_shape *check_shapes;       /* what `llmkern check` runs */
    int n_check_shapes;
    /* Times forward, backward and forward+backward of the case (shape, opts): writes
     * rows[0..2]. opts is never NULL; its members are NULL unless the op takes them. */
    lk_status (*bench)(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]);
    lk_shape bench_shape;               /* the default size */
    unsigned case_opts;                 /* the LK_CASE_* options its bench takes (0: none) */
    /* Optional: checks a bench case for impl without running it, so that a bad --size or
     * option is refused before anything is timed. LK_EINVAL naming the option, expected vs
     * got; LK_EUNAVAILABLE when the case is valid but impl cannot run it. */
    lk_status (*bench_validate)(const lk_impl *impl, const lk_shape *shape, const lk_case_opts *opts);
    /* Optional: the LK_DTYPE_BIT mask check and bench can run; 0 (the usual): every
     * dtype a row takes (its needs.dtypes). */
    unsigned dtypes;
} lk_harness;

/* 1 when check and bench run impl in dt: a dtype of impl's row that h can run. */
int lk_harness_runs(const lk_harness *h, const lk_impl *impl, lk_dtype dt);

/* The check_shapes and n_check_shapes of a harness: every shape of the array `shapes`. */
#define LK_CHECK_SHAPES(shapes) .check_shapes = shapes, .n_check_shapes = (int)(sizeof shapes / sizeof *shapes)

/* Measures copy bandwidth and the GEMM rate; rows[0..1] describe them as bench rows. */
lk_status lk_measure_ceilings(lk_ceilings *c, lk_bench_row rows[2]);

/* The harness of an op, or NULL when this build has none. */
const lk_harness *lk_harness_get(lk_op op);

/* --- shared pieces for harnesses ---------------------------------------------- */

/* "8192x4096" <-> shape */
const char *lk_shape_format(const lk_shape *s, char *buf, size_t n);
lk_status lk_shape_parse(const char *text, lk_shape *s);
int64_t lk_shape_numel(const lk_shape *s);

/* Starts a check row of impl (NULL: "(null)") of op in dt on shape, with tol and a worst
 * error of +inf until lk_check_row_end gives the verdict. */
void lk_check_row_begin(lk_check_row *row, const char *op, const lk_impl *impl, lk_dtype dt, const lk_shape *shape,
                        double tol);
/* The row's verdict: its worst error max_rel_err (NaN counts as +inf), a pass when it is
 * within tol. */
void lk_check_row_end(lk_check_row *row, double max_rel_err);

/* A buffer of n elements of dt filled with normal(0, std) (rounded to dt), and the
 * same values as double in ref (may be NULL). Caller frees both with free(). */
void *lk_random_tensor(lk_rng *rng, lk_dtype dt, int64_t n, float std, double **ref);
/* Fills n elements with NaN so an unwritten output fails the comparison. */
void lk_poison(void *data, lk_dtype dt, int64_t n);
/* max|got - ref| / max|ref| over n elements; a NaN anywhere gives +inf. */
double lk_rel_err(const void *got, lk_dtype dt, const double *ref, int64_t n);
/* The same for two double arrays (a reference held against another). */
double lk_rel_err_f64(const double *got, const double *want, int64_t n);

/* --- a check's tensors on its row's device ---------------------------------------- */
/* A check builds its inputs and poisoned outputs in host memory whatever the row's
 * device. For a CUDA row, lk_place_tensor gives each tensor of the call a device copy of
 * those bytes (the tensor then points at it, so a poisoned output is poisoned there too),
 * lk_place_fetch copies the outputs back over their host buffers once the passes ran, and
 * the check compares the host buffers as on the CPU; lk_place_end frees the copies. The
 * moves are the model's per-device ones (src/model/device.h: alloc, put, get), present in
 * CUDA builds only, so this code calls no CUDA itself. For a CPU row every call leaves the
 * tensors as they are: the passes run on the host buffers, as they always did.
 *
 *   lk_placement pl;
 *   lk_place_begin(&pl, "rms_norm", impl);
 *   lk_place_tensors(&pl, LK_TENSORS({"x", &a.x}, {"weight", &a.weight}), 0);
 *   lk_place_tensors(&pl, LK_TENSORS({"y", &a.y}, {"dx", &a.dx}), 1);
 *   lk_ctx ctx = lk_place_ctx(&pl, &arena);
 *   if ((s = pl.status) || (s = forward) || (s = backward) || (s = lk_place_fetch(&pl))) goto done;
 *   ... compare the host buffers ...
 * done: lk_place_end(&pl);                                                              */
#define LK_PLACE_MAX 24
typedef struct {
    const char *op;             /* for error messages */
    lk_device device;           /* the row's: where placed tensors live */
    /* The device's moves (NULL on the CPU): bytes of device memory (NULL when out of it),
     * its release, and synchronous copies host -> device and device -> host. */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    lk_status (*put)(void *dst, const void *host_src, size_t bytes);
    lk_status (*get)(void *host_dst, const void *src, size_t bytes);
    lk_status status;           /* the first failure; every later place does nothing */
    int n;
    struct {
        void *host, *dev;
        size_t bytes;
        int out;                /* copied back by lk_place_fetch */
    } buf[LK_PLACE_MAX];
} lk_placement;

/* Starts the placement of one check of impl (NULL: on the host) for op. Allocates
 * nothing, so lk_place_end is safe after any failure. LK_EUNAVAILABLE (also kept in
 * p->status) when impl's device has no moves in this build. */
lk_status lk_place_begin(lk_placement *p, const char *op, const lk_impl *impl);
/* Moves t (named name in errors) to the row's device: its bytes copied into new device
 * memory, t->data and t->device set to it; out: an output, copied back by lk_place_fetch.
 * A tensor whose bytes lie inside a buffer already placed shares its copy (an in-place
 * pair such as dx over dy). No data: only t->device is set. On the CPU: nothing. A failure
 * (LK_ENOMEM, LK_EDEVICE, LK_EINTERNAL past LK_PLACE_MAX buffers) is kept in p->status. */
void lk_place_tensor(lk_placement *p, const char *name, lk_tensor *t, int out);
/* A tensor of a check's call and its name in errors, for lk_place_tensors. */
typedef struct {
    const char *name;
    lk_tensor *t;
} lk_named_tensor;
/* A list of them, ending in a NULL name: LK_TENSORS({"x", &a.x}, {"weight", &a.weight}). */
#define LK_TENSORS(...) (const lk_named_tensor[]){__VA_ARGS__, {NULL, NULL}}
/* lk_place_tensor for each tensor of list in order, each an output when out: a call's
 * inputs in one list and its outputs in another. */
void lk_place_tensors(lk_placement *p, const lk_named_tensor *list, int out);
/* The same for what a forward saves for its backward. */
void lk_place_saved(lk_placement *p, const char *name, lk_saved *s, int out);
/* The context of the passes: on the row's device, with arena (set to that device; it must
 * not hold a block yet). The CPU's is lk_ctx_cpu(arena). */
lk_ctx lk_place_ctx(const lk_placement *p, lk_arena *arena);
/* Copies every output back over its host buffer, after the queued passes finished;
 * p->status if a place failed, else the first copy's error (a kernel's fault shows here,
 * LK_EDEVICE). LK_OK on the CPU. */
lk_status lk_place_fetch(lk_placement *p);
/* Frees every device copy; p may be used again after lk_place_begin. */
void lk_place_end(lk_placement *p);

/* A tolerance of an op's check: for impl (NULL: any implementation) in dt. */
typedef struct {
    const char *impl;
    lk_dtype dt;
    double tol;
} lk_tol;
/* The first of the n entries that fits impl and dt, else fallback. */
double lk_tol_find(const lk_tol *tols, size_t n, const lk_impl *impl, lk_dtype dt, double fallback);

/* Median milliseconds of fn(arg) over at least 3 runs after a warm-up, more while
 * min_seconds last. The first failing call stops the timing and its status is returned
 * in *err (a failed call is never timed as a fast one). */
double lk_time_ms(lk_status (*fn)(void *), void *arg, double min_seconds, lk_status *err);

/* One implementation's passes, timed: forward, backward, and forward+backward. */
typedef struct {
    const char *op;
    const lk_impl *impl;
    lk_dtype dtype;
    const lk_shape *shape;
    lk_status (*fwd)(void *job);
    lk_status (*bwd)(void *job);
    void *job;
    double flops[2];        /* useful FLOPs per forward and per backward; 0 for memory-bound ops */
    double bytes[2];        /* bytes that must move per forward and per backward */
    const lk_arena *arena;  /* the op's workspace: its peak is read after the runs */
    size_t extra_bytes;     /* held besides the arena: what the forward saves, f32 temporaries */
} lk_bench_spec;

/* Defines bench_job (impl, the op's args a by value, a context) and run_fwd / run_bwd,
 * the calls a bench times, through the op's facade: the lk_bench_spec fwd and bwd of
 * the op's harness. */
#define LK_BENCH_JOB(args_type, forward_fn, backward_fn)                                                 \
    typedef struct {                                                                                     \
        const lk_impl *impl;                                                                             \
        args_type a;                                                                                     \
        lk_ctx ctx;                                                                                      \
    } bench_job;                                                                                         \
    static lk_status run_fwd(void *p) { bench_job *j = p; return forward_fn(j->impl, &j->a, &j->ctx); }  \
    static lk_status run_bwd(void *p) { bench_job *j = p; return backward_fn(j->impl, &j->a, &j->ctx); }

/* A bench buffer of bytes, cache-line aligned so a kernel may stream its stores (its
 * size rounded up to 64); free() it. NULL when out of memory. */
void *lk_bench_alloc(size_t bytes);

/* Fills rows[0..2] (fwd, bwd, fwd+bwd): time, GB/s, GFLOP/s, the fraction of the GEMM
 * ceiling (ops with flops) or of the copy ceiling (the others), and peak extra memory. */
lk_status lk_bench_passes(const lk_bench_spec *b, const lk_ceilings *ceil, lk_bench_row rows[3]);

#endif
