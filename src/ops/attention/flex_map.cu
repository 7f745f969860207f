/* flex_map.cu — flex_attention's device side outside the kernels (issue 19): a BlockMask's
 * tiles on the GPU and ALiBi's slopes, for fa2.cu's and fa3.cu's flex rows.
 *
 * A mask is planned (flex_plan.c) and copied to the GPU on its first call there, then kept
 * in its `gpu` member until lk_block_mask_free; a standard family's bits are made on the
 * device by flex_bits from the family's parameters. A caller that makes a new mask of one
 * shape every step (the trainer's documents) stages it instead: it packs the plan into a
 * fixed image in pinned memory, copies it to its own device buffer and attaches it
 * (lk_attn_flex_attach), which a CUDA graph captures and replays. */
#include <stdlib.h>
#include "core/cuda_check.h"
#include "ops/attention/flex_plan.h"
#include "ops/attention/internal.h"

#define LOG2E 1.4426950408889634f

/* A host-to-device copy from pageable memory cannot be captured in a CUDA graph: the flex
 * row's first call with a mask (and ALiBi's slopes) says so instead of failing inside it. */
static lk_status not_capturing(cudaStream_t st, const char *what, const char *more) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone) return LK_OK;
    return lk_error(LK_EINVAL, "attention: %s: copied from the host, which a CUDA graph capture cannot hold: make "
                    "the mask's first call before capturing and keep the mask%s", what, more);
}

/* flex's ALiBi score_mod on the device: log2e · slope[h] of the H_q heads, in the arena. */
extern "C" size_t lk_attn_flex_alibi_bytes(const lk_attention_args *a) {
    return a->score_mod.fn == lk_score_mod_alibi ? lk_arena_piece((size_t)a->q.shape[1] * 4) : 0;
}

extern "C" lk_status lk_attn_flex_alibi(const lk_attention_args *a, lk_arena *ar, void *stream, const float **out) {
    *out = NULL;
    if (a->score_mod.fn != lk_score_mod_alibi) return LK_OK;
    lk_status s = not_capturing((cudaStream_t)stream, "score_mod",
                                " (ALiBi's slopes are copied every call: not capturable yet)");
    if (s) return s;
    const int64_t H = a->q.shape[1];
    float *d = (float *)lk_arena_alloc(ar, lk_attn_flex_alibi_bytes(a)), *h = (float *)malloc((size_t)H * 4);
    if (!d || !h) {
        free(h);
        return lk_error(LK_ENOMEM, "attention: score_mod: no room for ALiBi's %lld slopes", (long long)H);
    }
    for (int64_t i = 0; i < H; i++) h[i] = ((const float *)a->score_mod.ctx)[i] * LOG2E;
    cudaError_t e = cudaMemcpyAsync(d, h, (size_t)H * 4, cudaMemcpyHostToDevice, (cudaStream_t)stream);   /* staged */
    free(h);
    if (e != cudaSuccess) return lk_error(LK_EDEVICE, "attention: score_mod: ALiBi's slopes: %s", cudaGetErrorString(e));
    *out = d;
    return LK_OK;
}

typedef struct {
    struct lk_block_mask_gpu base;
    int device;
    void *mem;   /* the plan's copy, owned; NULL for a staged image (its owner's) */
    lk_flex_map map;
} flex_gpu;

static void flex_release(struct lk_block_mask_gpu *g) {
    if (((flex_gpu *)g)->mem) cudaFree(((flex_gpu *)g)->mem);   /* a staged mask's release may be inside a capture */
    free(g);
}

/* Each partial tile's bits from the family's program: a warp's ballot a word, by row then
 * by key (flex_plan.h). */
static __global__ void __launch_bounds__(256) flex_bits(const __grid_constant__ lk_flex_prog prog,
                                                       const int32_t *data, const int32_t *tile_of, const int32_t *count,
                                                       int H, int Q_LEN, int KV_LEN, uint32_t *bits) {
    constexpr int TW = LK_FLEX_TILE * LK_FLEX_WORDS;
    if (count && (int)blockIdx.x >= *count) return;   /* a staged image's grid is its capacity */
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, b = tile_of[3 * t] / H;
    const int64_t q0 = (int64_t)tile_of[3 * t + 1] * LK_FLEX_TILE, k0 = (int64_t)tile_of[3 * t + 2] * LK_FLEX_TILE;
    uint32_t *out = bits + (int64_t)t * LK_FLEX_TILE_WORDS;
    for (int u = w; u < 2 * TW; u += 8) {
        /* by row: row r, columns 32 (v % 4)..; by key (lk_flex_by_key): key r of half v / 256, queries 32 (v % 2).. */
        const int by_key = u >= TW, v = u - by_key * TW;
        const int r = by_key ? (v % 256) / 2 : v / LK_FLEX_WORDS;
        const int c = by_key ? 64 * (v / 256) + 32 * (v % 2) + lane : (v % LK_FLEX_WORDS) * 32 + lane;
        const int64_t i = q0 + (by_key ? c : r), j = k0 + (by_key ? r : c);
        const int seen = i < Q_LEN && j < KV_LEN && lk_flex_eval(&prog, data, b, i, j);
        const uint32_t word = __ballot_sync(0xffffffffu, seen);
        if (lane == 0) out[u] = word;
    }
}

/* The mask's tiles on this GPU: planned and copied on the first call, then the same. */
extern "C" lk_status lk_attn_flex_map(const lk_block_mask *m, void *stream, lk_flex_map *out) {
    cudaStream_t st = (cudaStream_t)stream;
    int dev;
    LK_CUDA_TRY(cudaGetDevice(&dev));
    if (m->gpu) {
        const flex_gpu *g = (const flex_gpu *)m->gpu;
        if (g->device != dev)
            return lk_error(LK_EINVAL, "attention: block_mask: expected the GPU it was first used on (%d), got GPU "
                            "%d (one mask a device: build another)", g->device, dev);
        *out = g->map;
        return LK_OK;
    }
    lk_flex_plan pl;
    lk_status s = not_capturing(st, "block_mask", "");
    if (s || (s = lk_flex_plan_make(m, &pl))) return s;
    const size_t lists = lk_arena_piece(pl.list_words * 4), bits = (size_t)pl.ntiles * LK_FLEX_TILE_WORDS * 4;
    const size_t data = (size_t)pl.ndata * 4;
    flex_gpu *g = (flex_gpu *)calloc(1, sizeof *g);
    char *mem = NULL;
    if (!g || cudaMalloc((void **)&mem, lists + bits + data + 4) != cudaSuccess) {
        free(g);
        lk_flex_plan_free(&pl);
        cudaGetLastError();
        return lk_error(LK_ENOMEM, "attention: block_mask: no room on the GPU for its %zu bytes of tiles and bits",
                        lists + bits + data);
    }
    /* from pageable memory: each copy is staged before it returns, so the plan may go */
    cudaError_t e = cudaMemcpyAsync(mem, pl.buf, pl.list_words * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess && !pl.has_prog && bits)
        e = cudaMemcpyAsync(mem + lists, pl.map.bits, bits, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess && pl.has_prog && data)
        e = cudaMemcpyAsync(mem + lists + bits, pl.data, data, cudaMemcpyHostToDevice, st);
    const int32_t *base = (const int32_t *)mem;
    if (e == cudaSuccess && pl.has_prog && pl.ntiles > 0) {
        flex_bits<<<(unsigned)pl.ntiles, 256, 0, st>>>(pl.prog, (const int32_t *)(mem + lists + bits),
                                                       base + (pl.tile_of - pl.buf), NULL, (int)m->H, (int)m->Q_LEN,
                                                       (int)m->KV_LEN, (uint32_t *)(mem + lists));
        e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
        cudaFree(mem);
        free(g);
        lk_flex_plan_free(&pl);
        return lk_error(LK_EDEVICE, "attention: block_mask: copying it to the GPU: %s", cudaGetErrorString(e));
    }
    lk_flex_map x = pl.map;
    x.kv_cnt = base + (pl.map.kv_cnt - pl.buf), x.kv_idx = base + (pl.map.kv_idx - pl.buf);
    x.kv_bit = base + (pl.map.kv_bit - pl.buf), x.q_cnt = base + (pl.map.q_cnt - pl.buf);
    x.q_idx = base + (pl.map.q_idx - pl.buf), x.q_bit = base + (pl.map.q_bit - pl.buf);
    x.bits = (const uint32_t *)(mem + lists);
    lk_flex_plan_free(&pl);
    g->base.release = flex_release, g->device = dev, g->mem = mem, g->map = x;
    ((lk_block_mask *)m)->gpu = &g->base;   /* the mask's cache (block_mask.h): immutable after first use */
    *out = x;
    return LK_OK;
}


extern "C" lk_status lk_attn_flex_attach(lk_block_mask *m, const lk_flex_image *L, const lk_flex_prog *prog,
                                        const int32_t *img, uint32_t *bits, void *stream) {
    int dev;
    LK_CUDA_TRY(cudaGetDevice(&dev));
    flex_gpu *g = (flex_gpu *)calloc(1, sizeof *g);
    if (!g) return lk_error(LK_ENOMEM, "attention: block_mask: out of memory attaching a staged mask");
    if (L->cap_tiles > 0) {
        flex_bits<<<(unsigned)L->cap_tiles, 256, 0, (cudaStream_t)stream>>>(
            *prog, img + L->data, img + L->tile_of, img + L->count, L->H, L->Q_LEN, L->KV_LEN, bits);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
            free(g);
            return lk_error(LK_EDEVICE, "attention: block_mask: the staged mask's bits: %s", cudaGetErrorString(e));
        }
    }
    const int64_t P = (int64_t)L->B * L->H, cells = P * L->nq * L->nk;
    lk_flex_map x = {.B = L->B, .H = L->H, .nq = L->nq, .nk = L->nk, .Q_LEN = L->Q_LEN, .KV_LEN = L->KV_LEN};
    x.kv_cnt = img, x.kv_idx = x.kv_cnt + 2 * P * L->nq, x.kv_bit = x.kv_idx + cells;   /* flex_plan.c's order */
    x.q_cnt = x.kv_bit + cells, x.q_idx = x.q_cnt + 2 * P * L->nk, x.q_bit = x.q_idx + cells, x.bits = bits;
    if (m->gpu) m->gpu->release(m->gpu);
    g->base.release = flex_release, g->device = dev, g->map = x;
    m->gpu = &g->base;
    return LK_OK;
}
