/* dist_train.c (GPUs) — training of the tiny configs (configs/tiny-dense and
 * tiny-moe.yaml, 20 steps) on GPUs over a DP x SP (x EP) mesh (train.device: cuda, one
 * GPU per rank; the gradient buckets summed over NCCL while the backward runs; the SP and
 * EP groups NCCL communicators split from that world: Ulysses attention, the SP loss and
 * the routers' aux loss summed on the device, the experts through alltoall or allgather)
 * against one GPU running the same batches as micro-batches (grad_accum = the DP size) on
 * rank 0, as tests/dist/dist_train.c does on CPUs: the same gradients up to summation
 * order and GEMM shapes, so the loss curve and the gradient norms agree within f32
 * tolerance, and within TOL_BF16 in bf16 (where each rank's shorter GEMMs round their
 * activations on their own). The meshes: at -np 2 dp 2 (dense and MoE), sp 2 (f32 and
 * bf16), sp 2 with ep 2, dp 2 with ep 2 (bf16, allgather); at -np 4 dp 4, dp 2 x sp 2,
 * sp 4 (fewer KV heads than SP ranks), dp 2 x sp 2 with ep 2 (f32 and bf16), sp 4 with
 * ep 4. The dp-only f32 one-GPU runs are also held against the CPU trainer (same seed,
 * same data, same math): the device changes the summation orders only. Then the overlap,
 * by timing: a larger dense model trained with no communication (each rank alone), with
 * one bucket (summed when the backward is over) and with buckets of LK_DP_BUCKETS_MIB
 * (default 128; most start during the backward), the median step time of each printed
 * (not asserted: speed belongs to benchmarks; bench/NOTES.md keeps the numbers).
 * LK_DIST_TRAIN_ONLY=timing runs that part alone.
 * Skipped (77) with fewer GPUs than ranks.
 * Run: mpirun -np 2|4 -x NCCL_NVLS_ENABLE=0 build/cuda_dist_train. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "dist_gpu.h"
#include "util.h"

#define STEPS 20
/* f32 on GPUs (exact f32 GEMMs, no TF32): the P micro-batch gradients summed in another
 * order (NCCL's ring), SP's shorter GEMMs and EP's gathered rows summing the same terms in
 * other orders too, grown a little by each AdamW step (the CPU's sp 2 x ep 2 run: 2.5e-6);
 * a wrong scale, a lost bucket or a rank's own aux loss moves the norm by >= 1/P */
#define TOL_DP 1e-4
/* the CPU's GEMMs and attention sum in other orders than the GPU's, over 12 steps */
#define TOL_CPU 1e-3
/* bf16: each rank's GEMMs over its share of the tokens round their outputs on their own,
 * and 20 AdamW steps carry it (a first bound: no multi-GPU machine has run it yet) */
#define TOL_BF16 2e-2

static lk_train_config tc;
static lk_ops_config ops;

/* configs/<name>.yaml, STEPS steps of it, on dev, grad_accum micro-batches a step, into out. */
static void tiny(const char *name, const char *out, lk_device_type dev, int64_t grad_accum, lk_dtype dt) {
    const char *src = getenv("LLMKERN_SOURCE_DIR");
    char path[600];
    snprintf(path, sizeof path, "%s/configs/%s.yaml", src ? src : "..", name);
    lk_train_config_init(&tc);
    lk_ops_config_init(&ops);
    lk_status s = lk_train_config_load_yaml(path, &tc, &ops);
    DIST_CHECK(s == LK_OK, "%s", path);
    tc.steps = STEPS; tc.grad_accum = grad_accum;
    tc.device = dev;
    tc.dtype = dt;   /* f32: within f32 tolerance of the CPU trainer */
    snprintf(tc.out, sizeof tc.out, "%s", out);
}

static double worst_of(const float *a, const float *b, const float *an, const float *bn, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) {
        double e = dist_rel_err(&a[i], &b[i], 1), en = dist_rel_err(&an[i], &bn[i], 1);
        w = fmax(w, fmax(e, en));
        if (isnan(e) || isnan(en)) w = INFINITY;
    }
    return w;
}

typedef struct {
    const char *name;          /* tiny-dense or tiny-moe */
    int dp, sp, ep;
    lk_dtype dt;
    const char *dispatcher;    /* moe.dispatcher under EP */
} mesh_case;

static void matches_one_gpu(const mesh_case *c) {
    int r = dist_world->rank, dp = c->dp;
    const char *name = c->name;
    int cpu_too = c->sp == 1 && c->ep == 1 && c->dt == LK_F32;
    double tol = c->dt == LK_F32 ? TOL_DP : TOL_BF16;
    char dir[64] = "/tmp/llmkern_cuda_dist_train_XXXXXX";
    float ref[STEPS] = {0}, ref_norm[STEPS] = {0}, cpu[STEPS] = {0}, cpu_norm[STEPS] = {0};
    float got[STEPS] = {0}, got_norm[STEPS] = {0};
    if (r == 0) {
        DIST_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        char path[128];
        snprintf(path, sizeof path, "%s/one_gpu", dir);
        tiny(name, path, LK_DEVICE_CUDA, dp, c->dt);
        lk_train_opts o = {.quiet = 1, .loss_log = ref, .grad_norm_log = ref_norm, .loss_log_cap = STEPS};
        double t0 = lk_now();
        DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, NULL) == LK_OK, "one-GPU run");
        double t1 = lk_now();
        if (cpu_too) {
            snprintf(path, sizeof path, "%s/cpu", dir);
            tiny(name, path, LK_DEVICE_CPU, dp, LK_F32);
            o.loss_log = cpu, o.grad_norm_log = cpu_norm;
            DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, NULL) == LK_OK, "CPU run");
        }
        printf("  %s: one GPU %.1f s", name, t1 - t0);
        if (cpu_too) printf(", CPU %.1f s", lk_now() - t1);
        printf("\n");
    }
    DIST_CHECK(lk_comm_broadcast(dist_world, dir, sizeof dir, 0) == LK_OK, "broadcast dir");
    char out[128];
    snprintf(out, sizeof out, "%s/dp", dir);
    tiny(name, out, LK_DEVICE_CUDA, 1, c->dt);
    tc.dp = dp, tc.sp = c->sp, tc.ep = c->ep;
    if (c->ep > 1) lk_ops_config_set(&ops, "moe.dispatcher", c->dispatcher, "test");
    lk_mesh mesh;
    DIST_CHECK(lk_train_mesh(&tc, dist_world, &mesh) == LK_OK && mesh.dp_size == dp && mesh.sp_size == c->sp &&
               mesh.ep_size == c->ep, "mesh dp %d sp %d ep %d", dp, c->sp, c->ep);
    /* 8 KiB buckets: the tiny model's gradients travel in many, most while its backward runs */
    lk_train_opts o = {.quiet = 1, .loss_log = got, .grad_norm_log = got_norm, .loss_log_cap = STEPS,
                       .mesh = &mesh, .bucket_bytes = 8 << 10};
    lk_train_result res = {0};
    DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, &res) == LK_OK, "dp %d sp %d ep %d on GPUs", dp, c->sp, c->ep);
    DIST_CHECK(res.buckets > STEPS && res.buckets_early * 2 >= res.buckets, "buckets %lld, %lld during the backward",
               (long long)res.buckets, (long long)res.buckets_early);
    lk_mesh_destroy(&mesh);
    if (r == 0) {
        double w = worst_of(got, ref, got_norm, ref_norm, STEPS);
        double wc = cpu_too ? worst_of(ref, cpu, ref_norm, cpu_norm, STEPS) : 0;
        for (int i = 0; i < STEPS; i++)
            printf("  step %2d: loss mesh %.7f one GPU %.7f CPU %.7f | grad norm mesh %.6f one GPU %.6f CPU %.6f\n",
                   i + 1, got[i], ref[i], cpu[i], got_norm[i], ref_norm[i], cpu_norm[i]);
        printf("dist_train (cuda): %s %s, dp %d sp %d ep %d%s%s on GPUs vs one GPU, %d steps (loss %.4f -> %.4f): "
               "worst relative difference %.2g (loss or grad norm; tolerance %.0e)", name, lk_dtype_name(c->dt), dp,
               c->sp, c->ep, c->ep > 1 ? " " : "", c->ep > 1 ? c->dispatcher : "", STEPS, got[0], got[STEPS - 1], w,
               tol);
        if (cpu_too) printf("; one GPU vs CPU %.2g (tolerance %.0e)", wc, TOL_CPU);
        printf("; %lld all-reduce buckets, %lld started during the backward\n", (long long)res.buckets,
               (long long)res.buckets_early);
        DIST_CHECK(w <= tol, "mesh vs one GPU: %.3g", w);
        DIST_CHECK(wc <= TOL_CPU, "one GPU vs CPU: %.3g", wc);
        DIST_CHECK(ref[STEPS - 1] < ref[0] - 0.5, "the loss falls: %g -> %g", ref[0], ref[STEPS - 1]);
        char path[200];
        snprintf(path, sizeof path, "%s/loss.csv", out);
        DIST_CHECK(access(path, F_OK) == 0, "rank 0 wrote %s", path);
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        DIST_CHECK(access(path, F_OK) == 0, "rank 0 wrote %s (from the GPU)", path);
    }
    float r0[STEPS];
    memcpy(r0, got, sizeof r0);
    DIST_CHECK(lk_comm_broadcast(dist_world, r0, sizeof r0, 0) == LK_OK, "broadcast losses");
    DIST_CHECK(memcmp(r0, got, sizeof r0) == 0, "rank %d's losses equal rank 0's", r);
    DIST_CHECK(lk_comm_barrier(dist_world) == LK_OK, "barrier");
    if (r == 0) dist_rm_rf(dir);
}

/* --- the overlap, by timing ------------------------------------------------------------ */

static double stamps[64];
static void stamp(void *user, int64_t step, struct lk_model *m) {
    (void)user, (void)m;
    if (step < 64) stamps[step] = lk_now();
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median step time (s) of the larger model's run: the intervals between the starts
 * of steps 1 .. steps-1 (step 0 warms up). bucket_bytes 0: no mesh, every rank trains
 * alone at the same time (the step without any communication). */
static double median_step(int64_t bucket_bytes, int64_t steps, lk_train_result *res) {
    int r = dist_world->rank;
    char dir[64] = "/tmp/llmkern_cuda_dp_time_XXXXXX";
    if (r == 0 || !bucket_bytes) DIST_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    if (bucket_bytes) DIST_CHECK(lk_comm_broadcast(dist_world, dir, sizeof dir, 0) == LK_OK, "broadcast dir");
    tiny("tiny-dense", dir, LK_DEVICE_CUDA, 1, LK_F32);
    lk_qwen3_config *c = &tc.model;
    c->hidden_size = 2048; c->num_hidden_layers = 8; c->num_attention_heads = 16; c->num_key_value_heads = 4;
    c->head_dim = 128; c->intermediate_size = 5632; c->vocab_size = 32000; c->max_position_embeddings = 1024;
    c->tie_word_embeddings = 0;
    tc.steps = steps + 1; tc.batch_size = 4; tc.seq_len = 512; tc.corpus_docs = 512;
    tc.dp = bucket_bytes ? dist_world->size : 0;
    lk_mesh mesh;
    if (bucket_bytes) DIST_CHECK(lk_train_mesh(&tc, dist_world, &mesh) == LK_OK, "mesh");
    /* stop_at: no checkpoint or model written at the end (gigabytes, and not the point) */
    lk_train_opts o = {.quiet = 1, .mesh = bucket_bytes ? &mesh : NULL, .bucket_bytes = bucket_bytes,
                       .before_step = stamp, .stop_at = steps};
    DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, res) == LK_OK, "timing run");
    if (bucket_bytes) lk_mesh_destroy(&mesh);
    double d[64];
    int n = 0;
    for (int64_t i = 1; i + 1 < steps && i < 63; i++) d[n++] = stamps[i + 1] - stamps[i];
    qsort(d, (size_t)n, sizeof *d, cmp);
    DIST_CHECK(lk_comm_barrier(dist_world) == LK_OK, "barrier");
    if (r == 0 || !bucket_bytes) dist_rm_rf(dir);
    return n ? d[n / 2] : 0;
}

/* The step alone (no communication), with one bucket summed after the backward, and with
 * the buckets of LK_DP_BUCKETS_MIB (a comma list; default 128, the GPU trainer's default)
 * started as the backward makes them final. */
static void overlap_timing(void) {
    const int64_t steps = 10;
    lk_train_result a = {0}, w = {0};
    double alone = median_step(0, steps, &a), whole = median_step((int64_t)1 << 40, steps, &w);
    int P = dist_world->size;
    if (dist_world->rank == 0)
        printf("dist_train (cuda): overlap, dense hidden 2048 x 8 layers, vocab 32000 (%.0f M parameters, f32 "
               "gradients), 4 x 512 tokens a rank, dp %d: median step %.1f ms alone (no communication), %.1f ms "
               "with one bucket summed after the backward\n",
               (8.0 * (2 * 2048.0 * 2048 + 2 * 2048.0 * 512 + 3 * 2048.0 * 5632) + 2 * 32000.0 * 2048) / 1e6, P,
               alone * 1e3, whole * 1e3);
    DIST_CHECK(w.buckets_early == 0, "one bucket: %lld started early", (long long)w.buckets_early);
    const char *list = getenv("LK_DP_BUCKETS_MIB");
    char buf[128];
    snprintf(buf, sizeof buf, "%s", list && *list ? list : "128");
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int64_t mib = atoll(tok);
        if (mib < 1) continue;
        lk_train_result b = {0};
        double over = median_step(mib << 20, steps, &b);
        if (dist_world->rank == 0)
            printf("  %lld MiB buckets: median step %.1f ms (%lld of %lld buckets started during the backward): "
                   "%.1f ms of the %.1f ms the one bucket added are hidden\n", (long long)mib, over * 1e3,
                   (long long)b.buckets_early, (long long)b.buckets, (whole - over) * 1e3, (whole - alone) * 1e3);
        DIST_CHECK(b.buckets_early * 2 >= b.buckets, "%lld MiB: %lld of %lld early", (long long)mib,
                   (long long)b.buckets_early, (long long)b.buckets);
    }
}

int main(void) {
    dist_begin();
    if (!dist_gpus_enough("dist_train (cuda)", INT_MAX)) return 77;
    const char *only = getenv("LK_DIST_TRAIN_ONLY");   /* "timing": the overlap alone (experiments) */
    if (!only || strcmp(only, "timing") != 0) {
        const lk_dtype F = LK_F32, H = LK_BF16;
        const mesh_case two[] = {
            {"tiny-dense", 2, 1, 1, F, NULL}, {"tiny-moe", 2, 1, 1, F, NULL},
            {"tiny-dense", 1, 2, 1, F, NULL}, {"tiny-dense", 1, 2, 1, H, NULL},
            {"tiny-moe", 1, 2, 2, F, "alltoall"}, {"tiny-moe", 2, 1, 2, H, "allgather"},
        };
        const mesh_case four[] = {
            {"tiny-dense", 4, 1, 1, F, NULL}, {"tiny-moe", 4, 1, 1, F, NULL},
            {"tiny-dense", 2, 2, 1, F, NULL}, {"tiny-dense", 1, 4, 1, H, NULL},
            {"tiny-moe", 2, 2, 2, F, "alltoall"}, {"tiny-moe", 2, 2, 2, H, "alltoall"},
            {"tiny-moe", 1, 4, 4, F, "allgather"},
        };
        int P = dist_world->size, n = P == 2 ? 6 : P == 4 ? 7 : 0;
        for (int i = 0; i < n; i++) matches_one_gpu(P == 2 ? &two[i] : &four[i]);
        if (n == 0) {   /* another size: data parallelism alone */
            matches_one_gpu(&(mesh_case){"tiny-dense", P, 1, 1, F, NULL});
            matches_one_gpu(&(mesh_case){"tiny-moe", P, 1, 1, F, NULL});
        }
    }
    overlap_timing();
    return dist_end("dist_train (cuda)");
}
