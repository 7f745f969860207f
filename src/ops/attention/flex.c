/* flex.c — the `flex_attention` adapter: the tiled engine of flash.c driven by a
 * BlockMask. Tiles are the mask's blocks: empty blocks are never visited, full blocks
 * run without the predicate, partial blocks evaluate it per element (through its row
 * form when the mask's builder gave one). The backward walks the transposed q_* lists.
 * The mask alone decides visibility: causal and window options beside it are ignored
 * (the facade rejects varlen metadata and dense masks for flex, so nothing else could
 * hide a key). */
#include "ops/attention/internal.h"


/* Offset of (b, h) in the mask's [B, H, ...] arrays, broadcasting dims of size 1. */
static int64_t bh_of(const lk_block_mask *m, int64_t b, int64_t h) {
    return (m->B == 1 ? 0 : b) * m->H + (m->H == 1 ? 0 : h);
}

/* The partial then the full blocks of one row of a (num, indices) pair of lists. */
static int64_t gather(const int32_t *num, const int32_t *ind, const int32_t *fnum, const int32_t *find,
                      int64_t row, int64_t width, int32_t *idx, uint8_t *full) {
    int64_t n = 0;
    for (int32_t i = 0; i < num[row]; i++) { idx[n] = ind[row * width + i]; full[n++] = 0; }
    for (int32_t i = 0; fnum && i < fnum[row]; i++) { idx[n] = find[row * width + i]; full[n++] = 1; }
    return n;
}

static int64_t flex_kv_tiles(const lk_attn_src *s, int64_t b, int64_t h, int64_t qt, int32_t *idx, uint8_t *full) {
    const lk_block_mask *m = s->self;
    int64_t row = bh_of(m, b, h) * m->num_q_blocks + qt;
    return gather(m->kv_num_blocks, m->kv_indices, m->full_kv_num_blocks, m->full_kv_indices, row,
                  m->num_kv_blocks, idx, full);
}

static int64_t flex_q_tiles(const lk_attn_src *s, int64_t b, int64_t h, int64_t kt, int32_t *idx, uint8_t *full) {
    const lk_block_mask *m = s->self;
    int64_t row = bh_of(m, b, h) * m->num_kv_blocks + kt;
    return gather(m->q_num_blocks, m->q_indices, m->full_q_num_blocks, m->full_q_indices, row, m->num_q_blocks,
                  idx, full);
}

static void flex_mask(const lk_attn_src *s, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                      uint8_t *seen, int64_t lds) {
    const lk_block_mask *m = s->self;
    if (m->mask_row) {                  /* the builder's row form: one call a row */
        for (int64_t i = 0; i < nq; i++) m->mask_row(b, h, q0 + i, k0, nk, seen + i * lds, m->mask_ctx);
        return;
    }
    lk_mask_fn fn = m->mask_mod;
    const void *ctx = m->mask_ctx;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nk; j++) seen[i * lds + j] = fn(b, h, q0 + i, k0 + j, ctx);
}

static lk_attn_src source(const lk_attention_args *a) {
    const lk_block_mask *m = a->block_mask;
    return (lk_attn_src){.tq = m->Q_BLOCK_SIZE, .tk = m->KV_BLOCK_SIZE, .kv_tiles = flex_kv_tiles,
                         .q_tiles = flex_q_tiles, .mask_tile = flex_mask, .self = m};
}

static size_t flex_workspace(const lk_attention_args *a, int backward) {
    return lk_attn_tiled_workspace(a, a->block_mask->Q_BLOCK_SIZE, a->block_mask->KV_BLOCK_SIZE, backward);
}
static lk_status flex_forward(const lk_attention_args *a, lk_ctx *ctx) {
    lk_attn_src s = source(a);
    return lk_attn_tiled_forward(a, ctx, &s);
}
static lk_status flex_backward(const lk_attention_args *a, lk_ctx *ctx) {
    lk_attn_src s = source(a);
    return lk_attn_tiled_backward(a, ctx, &s);
}

const lk_attention_vtable lk_attention_flex_backend = {
    .version = LK_ATTENTION_VTABLE_VERSION,
    .saved_bytes = lk_attn_lse_bytes,
    .workspace_bytes = flex_workspace,
    .forward = flex_forward,
    .backward = flex_backward,
};
