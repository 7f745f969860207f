/* doc_mask.c — the batch's documents as a BlockMask, for a model whose attention is
 * flex_attention (it follows its mask alone: causal within each packed document, over all
 * B·S tokens of the batch). Built on the host each step from cu_seqlens. On a GPU the
 * mask's plan is staged (flex_plan.h) so that a step neither allocates nor waits: the host
 * side (stage_batch, which a CUDA graph's replay runs too) packs it into the step's pinned
 * slot; the device side (the forward) copies the slot to the model's buffer and makes the
 * bits there, work a CUDA graph captures. The buffers are sized once per token count. */
#include <string.h>
#include "model/qwen3_internal.h"

/* The bits follow the image at a 256-byte boundary (the kernels read them as 16-byte rows). */
static size_t bits_at(const lk_flex_image *L) { return ((size_t)L->words * 4 + 255) & ~(size_t)255; }

void lk_qwen3_doc_mask_free(lk_model *m) {
    if (m->dev) m->dev->free(m->flex_dev), m->dev->host_free(m->flex_host);
    m->flex_dev = NULL, m->flex_host = NULL;
}

/* The buffers for masks shaped like p: room for any documents' partial tiles. */
static lk_status alloc_stage(lk_model *m, const lk_flex_plan *p) {
    const lk_flex_image L = lk_flex_image_of(p, lk_flex_documents_cap(p->map.Q_LEN), p->ndata);
    const size_t bytes = bits_at(&L) + (size_t)L.cap_tiles * LK_FLEX_TILE_WORDS * 4;
    m->flex_img = L, m->flex_prog = p->prog;
    m->flex_dev = m->dev->alloc(bytes);
    m->flex_host = m->dev->host_alloc((size_t)LK_STAGE_SLOTS * (size_t)L.words * 4);
    if (m->flex_dev && m->flex_host) return LK_OK;
    lk_qwen3_doc_mask_free(m);
    return lk_error(LK_ENOMEM, "model: flex_attention's document mask: out of device or pinned memory for %zu bytes",
                    bytes);
}

lk_status lk_qwen3_doc_mask_stage(lk_model *m, const lk_batch *whole) {
    lk_block_mask_free(&m->doc_mask);
    lk_status s = lk_block_mask_document_cu(whole->cu_seqlens, whole->n_segs, 1, 1, whole->B * whole->S, 0, 0,
                                            &m->doc_mask);
    if (s || m->dev->type == LK_DEVICE_CPU) return s;
    lk_flex_plan p;
    if ((s = lk_flex_plan_make(&m->doc_mask, &p))) return s;
    if (!m->flex_dev) s = alloc_stage(m, &p);
    else if (memcmp(&p.prog, &m->flex_prog, sizeof p.prog))   /* a captured bits kernel holds the program */
        s = lk_error(LK_EINVAL, "model: flex_attention's document mask: expected the program of the staged masks");
    if (!s) s = lk_flex_image_pack(&m->flex_img, &p, m->flex_host + (size_t)m->stage_slot * (size_t)m->flex_img.words);
    lk_flex_plan_free(&p);
    return s;
}

lk_status lk_qwen3_doc_mask_put(lk_model *m) {
    if (!m->flex_dev) return LK_OK;   /* the CPU: the mask's own lists */
    const lk_flex_image *L = &m->flex_img;
    const int32_t *slot = m->flex_host + (size_t)m->stage_slot * (size_t)L->words;
    lk_status s = m->dev->put_async(m->flex_dev, slot, (size_t)L->words * 4, &m->ctx);
    return s ? s : m->dev->flex_attach(&m->doc_mask, L, &m->flex_prog, m->flex_dev,
                                       (uint32_t *)((char *)m->flex_dev + bits_at(L)), &m->ctx);
}
