/* doc_mask.c — the batch's documents as BlockMasks, for a model whose attention is
 * flex_attention (it follows its mask alone): causal within each packed document, over
 * all B·S tokens of the batch, and for sliding-window layers the same within the window.
 * Built on the host each step from cu_seqlens. On a GPU each mask's plan is staged
 * (flex_plan.h) so that a step neither allocates nor waits: the host side (stage_batch,
 * which a CUDA graph's replay runs too) packs it into the step's pinned slot; the device
 * side (the forward) copies the slot to the model's buffer and makes the bits there, work
 * a CUDA graph captures. The buffers are sized once per token count. */
#include <string.h>
#include "model/qwen3_internal.h"

/* The bits follow the image at a 256-byte boundary (the kernels read them as 16-byte rows). */
static size_t bits_at(const lk_flex_image *L) { return ((size_t)L->words * 4 + 255) & ~(size_t)255; }

/* The sliding window of the model's flex layers (they share config.json's), or 0. */
static int64_t flex_window(const lk_model *m) {
    for (int l = 0; l < (int)m->cfg.num_hidden_layers; l++) {
        const lk_attention_entry *e = m->layers[l].ops.attn->vtable;
        if (e && e->adapter == LK_ATTN_FLEX && lk_qwen3_layer_window(&m->cfg, l) > 0) return m->cfg.sliding_window;
    }
    return 0;
}

void lk_qwen3_doc_mask_free(lk_model *m, int masks_too) {
    for (int i = 0; i < 2; i++) {
        lk_staged_mask *x = &m->masks[i];
        if (m->dev) m->dev->free(x->dev), m->dev->host_free(x->host);
        x->dev = NULL, x->host = NULL;
    }
    if (!masks_too) return;
    lk_block_mask_free(&m->masks[1].mask);   /* before the masks its AND reads */
    lk_block_mask_free(&m->masks[0].mask);
    lk_block_mask_free(&m->window);
}

/* x's buffers for masks shaped like p: room for any documents' partial tiles. */
static lk_status alloc_stage(lk_model *m, lk_staged_mask *x, const lk_flex_plan *p, int64_t window) {
    const lk_flex_image L = lk_flex_image_of(p, lk_flex_documents_cap(p->map.Q_LEN, window), p->ndata);
    const size_t bytes = bits_at(&L) + (size_t)L.cap_tiles * LK_FLEX_TILE_WORDS * 4;
    x->img = L, x->prog = p->prog;
    x->dev = m->dev->alloc(bytes);
    x->host = m->dev->host_alloc((size_t)LK_STAGE_SLOTS * (size_t)L.words * 4);
    if (x->dev && x->host) return LK_OK;
    lk_qwen3_doc_mask_free(m, 0);
    return lk_error(LK_ENOMEM, "model: flex_attention's document mask: out of device or pinned memory for %zu bytes",
                    bytes);
}

/* Plans x's mask into the step's slot. */
static lk_status stage(lk_model *m, lk_staged_mask *x, int64_t window) {
    lk_flex_plan p;
    lk_status s = lk_flex_plan_make(&x->mask, &p);
    if (s) return s;
    if (!x->dev) s = alloc_stage(m, x, &p, window);
    else if (memcmp(&p.prog, &x->prog, sizeof p.prog))   /* a captured bits kernel holds the program */
        s = lk_error(LK_EINVAL, "model: flex_attention's document mask: expected the program of the staged masks");
    if (!s) s = lk_flex_image_pack(&x->img, &p, x->host + (size_t)m->stage_slot * (size_t)x->img.words);
    lk_flex_plan_free(&p);
    return s;
}

lk_status lk_qwen3_doc_mask_stage(lk_model *m, const lk_batch *whole) {
    const int64_t LEN = whole->B * whole->S, w = flex_window(m);
    lk_block_mask_free(&m->masks[1].mask);
    lk_block_mask_free(&m->masks[0].mask);
    lk_status s = lk_block_mask_document_cu(whole->cu_seqlens, whole->n_segs, 1, 1, LEN, 0, 0, &m->masks[0].mask);
    if (!s && w && m->window.Q_LEN != LEN) {   /* the window's own mask: once per token count */
        lk_block_mask_free(&m->window);
        s = lk_block_mask_sliding_window(w, 1, 1, LEN, LEN, 0, 0, &m->window);
    }
    if (!s && w) s = lk_block_mask_and(&m->masks[0].mask, &m->window, &m->masks[1].mask);
    if (s || m->dev->type == LK_DEVICE_CPU) return s;
    for (int i = 0; i < 1 + (w > 0) && !s; i++) s = stage(m, &m->masks[i], i ? w : 0);
    return s;
}

lk_status lk_qwen3_doc_mask_put(lk_model *m) {
    lk_status s = LK_OK;
    for (int i = 0; i < 2 && !s; i++) {
        lk_staged_mask *x = &m->masks[i];
        if (!x->dev) continue;   /* the CPU (the mask's own lists), or no sliding layer */
        const int32_t *slot = x->host + (size_t)m->stage_slot * (size_t)x->img.words;
        s = m->dev->put_async(x->dev, slot, (size_t)x->img.words * 4, &m->ctx);
        if (!s) s = m->dev->flex_attach(&x->mask, &x->img, &x->prog, x->dev,
                                        (uint32_t *)((char *)x->dev + bits_at(&x->img)), &m->ctx);
    }
    return s;
}
