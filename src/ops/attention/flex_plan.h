/* flex_plan.h — a BlockMask as the GPU's flex kernels walk it (issue 19): the mask's
 * lists re-cut into the kernels' 128 x 128 tiles, and each partial tile's elements as
 * bits. Built on the host (flex_plan.c, testable without a GPU), copied to the device
 * once per mask (flex_map.cu keeps the copy in the mask's `gpu` member), or staged into
 * fixed buffers when a caller makes a new mask of the same shape every step.
 *
 * Tiles of any mask block size: a 128 x 128 tile is empty when every mask block it
 * overlaps is empty, full when every one is full and the tile lies inside Q_LEN x KV_LEN,
 * partial otherwise (so a partial tile may hide nothing or everything: correct, only
 * slower; PyTorch's default block is 128, where the lists carry over one to one).
 *
 * Bits of a partial tile, two copies: by query row (row i: 4 words, bit j = key j) for the
 * kernels that walk keys (forward, deterministic dq), and by key for the dk/dv kernels,
 * whose threads each hold two keys against a step of 64 queries: per half of the queries,
 * key j's 2 words (bit i = query 64·half + i), so a step's bits are 1 KB in one piece
 * (lk_flex_by_key).
 * Elements outside Q_LEN x KV_LEN are 0. Who makes the bits: the standard families
 * (causal, sliding window, prefix-LM, documents and their AND/OR, recognized by their
 * predicates) become a small program (lk_flex_prog) a device kernel evaluates per
 * element, from its parameters, with no host callback; any other predicate is evaluated
 * here, on the host, over the partial tiles only (through its row form when it has one). */
#ifndef LLMKERN_OPS_ATTENTION_FLEX_PLAN_H
#define LLMKERN_OPS_ATTENTION_FLEX_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "llmkern/block_mask.h"

#ifdef __CUDACC__
#define LK_FLEX_HD __host__ __device__
#else
#define LK_FLEX_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LK_FLEX_TILE 128
#define LK_FLEX_WORDS (LK_FLEX_TILE / 32)                      /* words a row of a tile's bits */
#define LK_FLEX_TILE_WORDS (2 * LK_FLEX_TILE * LK_FLEX_WORDS)   /* both copies of a tile's bits */
#define LK_FLEX_NODES 16

/* The lists the kernels walk (host or device pointers: the same layout). P = B·H of the
 * mask (its broadcast dims stay 1). */
typedef struct {
    int32_t B, H, nq, nk, Q_LEN, KV_LEN;
    const int32_t *kv_cnt;    /* [P][nq][2]: partial and full kv tiles of a q tile */
    const int32_t *kv_idx;    /* [P][nq][nk]: the partial kv tiles ascending, then the full ones */
    const int32_t *kv_bit;    /* [P][nq][nk]: the bits tile of each partial entry */
    const int32_t *q_cnt, *q_idx, *q_bit;   /* the transpose: [P][nk][2], [P][nk][nq] x 2 */
    const uint32_t *bits;     /* [tiles][LK_FLEX_TILE_WORDS]: by query row, then by key */
    int32_t falling;          /* 1: in every pattern no kv tile is seen by more q tiles than the one
                               * before it, and the kv tiles see at most 3/4 of the most any sees on
                               * average (causal 1/2, prefix-LM 2,048 of 8,192 0.54): the backward's
                               * grid takes its key blocks longest first, as under a causal mask
                               * (grid_order.cuh). A sliding window's walks fall too, but at its
                               * 0.93 that order ran 1.4% slower (bench/NOTES.md, fifty-first
                               * session). 0 in a staged image, whose counts only the device holds */
} lk_flex_map;

/* Word offset in a tile's bits of key j's two words for queries [64·half, 64·half + 64). */
static inline LK_FLEX_HD int lk_flex_by_key(int half, int j) {
    return LK_FLEX_TILE * LK_FLEX_WORDS + half * 2 * LK_FLEX_TILE + 2 * j;
}

/* The pattern of (b, h) in the mask's [B, H] (broadcast dims are 1). */
static inline LK_FLEX_HD int lk_flex_pattern(const lk_flex_map *m, int b, int h) {
    return (m->B == 1 ? 0 : b) * m->H + (m->H == 1 ? 0 : h);
}

/* Row of kv tile kt of (b, h) in the transposed lists (q_cnt, q_idx, q_bit). */
static inline LK_FLEX_HD int lk_flex_q_row(const lk_flex_map *m, int b, int h, int kt) {
    return lk_flex_pattern(m, b, h) * m->nk + kt;
}

/* Steps of 64 query rows a dk/dv block walks (fa2.cu, fa3_bwd.cu): every q tile of mask
 * tile kt for each of kv head hk's G query heads, two steps a tile. */
static inline LK_FLEX_HD int lk_flex_steps(const lk_flex_map *m, int b, int hk, int G, int kt) {
    int n = 0;
    for (int j = 0; j < G; j++) {
        const int r = lk_flex_q_row(m, b, hk * G + j, kt);
        n += 2 * (m->q_cnt[2 * r] + m->q_cnt[2 * r + 1]);
    }
    return n;
}

/* A standard family as a postfix program over (b, i = q_idx, j = kv_idx). */
typedef enum { LK_FLEX_CAUSAL, LK_FLEX_WINDOW, LK_FLEX_PREFIX, LK_FLEX_DOC, LK_FLEX_AND, LK_FLEX_OR } lk_flex_op;
typedef struct {
    int32_t op, causal;
    int64_t offset, window;   /* CAUSAL: j <= i + offset; WINDOW: i + offset - window < j <= i + offset */
    int64_t q_at, kv_at;      /* PREFIX: lengths at data[q_at + b·q_stride]; DOC: ids at q_at / kv_at */
    int64_t q_stride, kv_stride;   /* per batch row (0: shared by every b) */
} lk_flex_node;
typedef struct {
    int n;
    lk_flex_node node[LK_FLEX_NODES];
} lk_flex_prog;

/* Visible? The program's stack lives in the bits of one word. */
static inline LK_FLEX_HD int lk_flex_eval(const lk_flex_prog *p, const int32_t *data, int64_t b, int64_t i,
                                          int64_t j) {
    uint32_t st = 0;
    for (int k = 0; k < p->n; k++) {
        const lk_flex_node *x = &p->node[k];
        int v;
        switch (x->op) {
        case LK_FLEX_CAUSAL: v = j <= i + x->offset; break;
        case LK_FLEX_WINDOW: v = j <= i + x->offset && j - (i + x->offset) > -x->window; break;
        case LK_FLEX_PREFIX: v = j < data[x->q_at + b * x->q_stride] || j <= i; break;
        case LK_FLEX_DOC:
            v = (!x->causal || j <= i) && data[x->q_at + b * x->q_stride + i] == data[x->kv_at + b * x->kv_stride + j];
            break;
        default: {   /* AND / OR of the two values on top */
            const uint32_t y = st & 1u, z = (st >> 1) & 1u;
            st >>= 2;
            v = x->op == LK_FLEX_AND ? (int)(y & z) : (int)(y | z);
        }
        }
        st = (st << 1) | (uint32_t)v;
    }
    return (int)(st & 1u);
}

typedef struct {
    lk_flex_map map;          /* host pointers into buf */
    int32_t *buf;             /* lists, the bits tiles' (pattern, q tile, kv tile), host bits */
    size_t list_words;        /* words of buf the device needs before the bits */
    int64_t ntiles;           /* partial tiles (bits tiles) */
    const int32_t *tile_of;   /* [ntiles][3]: pattern, q tile, kv tile */
    int has_prog;             /* 1: the device makes the bits from prog; 0: map.bits holds them */
    lk_flex_prog prog;
    int32_t *data;            /* the program's parameters (ids, prefix lengths) */
    int64_t ndata;
} lk_flex_plan;

/* Plans mask m (valid: the facade's checks passed), the host bits included when its
 * predicate is not a standard family. LK_ENOMEM; LK_EINVAL when the mask is too large
 * for the kernels' int32 tile indices. */
lk_status lk_flex_plan_make(const lk_block_mask *m, lk_flex_plan *out);
void lk_flex_plan_free(lk_flex_plan *p);

/* The document of position i under cu_seqlens (n_docs + 1 offsets): the last whose start
 * is at or before i (lk_mask_document's rule). */
int64_t lk_cu_doc_of(const int32_t *cu, int64_t n_docs, int64_t i);

/* The program of mask m's predicate when it is a standard family (or an AND/OR of them,
 * at most LK_FLEX_NODES nodes); data is allocated (free it). 0 = not one: its bits come
 * from the host. */
int lk_flex_prog_of(const lk_block_mask *m, lk_flex_prog *prog, int32_t **data, int64_t *ndata);

/* --- masks of one shape, staged (the trainer's documents: a new mask every step) -------
 * One image of fixed size holds any plan of shape (B, H, Q_LEN, KV_LEN) with at most
 * cap_tiles partial tiles and cap_data words of program data: the lists, the count of
 * partial tiles, tile_of and the data (words, in that order). The host packs a plan into
 * pinned memory; the device copies the image whole and makes the bits after it, so a CUDA
 * graph's copy and bits kernel replay whatever mask of the shape the host packed last. */
typedef struct {
    int32_t B, H, nq, nk, Q_LEN, KV_LEN;
    int64_t cap_tiles, cap_data;
    int64_t count, tile_of, data, words;   /* word offsets (the lists start at 0), the size */
} lk_flex_image;

/* The image of plans shaped like p, with room for cap_tiles partial tiles and cap_data
 * words of data. */
lk_flex_image lk_flex_image_of(const lk_flex_plan *p, int64_t cap_tiles, int64_t cap_data);
/* Packs p into image (L.words words). LK_EINVAL when p is not of L's shape, has more
 * partial tiles or data than L holds, or has no program (host bits are not staged). */
lk_status lk_flex_image_pack(const lk_flex_image *L, const lk_flex_plan *p, int32_t *image);
/* Partial tiles a causal document mask over LEN packed tokens can have, whatever its
 * documents, alone or ANDed with a sliding window (window > 0) (flex_plan.c says why):
 * the cap_tiles that staging it needs. */
int64_t lk_flex_documents_cap(int64_t LEN, int64_t window);

/* Attaches to m the image staged at img on this GPU (copied there on stream before this
 * call's work), its program's bits made on stream into bits (L.cap_tiles tiles): m's GPU
 * calls read them until lk_block_mask_free, which leaves img and bits to their owner.
 * prog must be the program of every mask packed into img. LK_ENOMEM, LK_EDEVICE. */
lk_status lk_attn_flex_attach(lk_block_mask *m, const lk_flex_image *L, const lk_flex_prog *prog, const int32_t *img,
                              uint32_t *bits, void *stream);

/* Mask m's map on the current GPU, planned and copied there on its first call (flex_map.cu; the
 * copy is kept in m->gpu), the family's bits made on stream. LK_EINVAL when the mask was
 * first used on another GPU; LK_ENOMEM, LK_EDEVICE. */
lk_status lk_attn_flex_map(const lk_block_mask *m, void *stream, lk_flex_map *out);

/* The GPU's copy of a mask (lk_block_mask.gpu): lk_block_mask_free calls release. */
struct lk_block_mask_gpu {
    void (*release)(struct lk_block_mask_gpu *self);
};

#ifdef __cplusplus
}
#endif
#endif
