/* params.c — the Qwen3 model's parameters: their layout in one flat f32 buffer on the
 * model's device (views named as in the Hugging Face checkpoints, fused where the ops
 * want them fused; under a bf16 master the bf16 copy alone, at the same offsets), their
 * initialization, and checkpoint save / load through checkpoint.h and hf_config.h (on a
 * GPU, or from bf16 values, through an f32 host copy of the whole buffer). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/checked.h"
#include "llmkern/checkpoint.h"
#include "model/qwen3_internal.h"

static int64_t align16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Lays out every tensor of the checkpoint's list: offsets into m->w, and m->params. */
static lk_status layout(lk_model *m) {
    const lk_qwen3_config *c = &m->cfg;
    size_t n;
    lk_status s = lk_qwen3_tensor_list(c, NULL, 0, &n);
    if (s) return s;
    lk_qwen3_tensor_ref *refs = malloc(n * sizeof *refs);
    m->params = calloc(n, sizeof *m->params);
    if (!refs || !m->params) { free(refs); return lk_error(LK_ENOMEM, "model: params: out of memory"); }
    lk_qwen3_tensor_list(c, refs, n, &n);
    int64_t cur = 0, gu = 0, dn = 0;
    for (size_t i = 0; i < n && !s; i++) {
        lk_qwen3_tensor_ref r = refs[i];
        lk_param *p = &m->params[i];
        int ndim;
        int64_t shape[2];
        if ((s = lk_qwen3_tensor_shape(c, r.kind, &ndim, shape)) ||
            (s = lk_qwen3_tensor_name(r.kind, r.layer, r.expert, p->name, sizeof p->name)))
            break;
        int64_t numel = ndim == 2 ? shape[0] * shape[1] : shape[0], off;
        lk_layer *L = r.layer >= 0 ? &m->layers[r.layer] : NULL;
        switch (r.kind) {
        case LK_QW_MLP_UP_PROJ:        /* right after gate_proj: the pair is gate_up [2I, H] */
        case LK_QW_K_PROJ:             /* right after q_proj, v_proj after it: the three are qkv [Q + 2K, H] */
        case LK_QW_V_PROJ:
            off = cur; cur += numel; break;
        case LK_QW_EXPERT_GATE_PROJ: off = gu + r.expert * 2 * numel; break;
        case LK_QW_EXPERT_UP_PROJ:   off = gu + (2 * r.expert + 1) * numel; break;
        case LK_QW_EXPERT_DOWN_PROJ: off = dn + r.expert * numel; break;
        default: off = cur = align16(cur); cur += numel; break;
        }
        switch (r.kind) {
        case LK_QW_EMBED: m->embed = off; break;
        case LK_QW_FINAL_NORM: m->final_norm = off; break;
        case LK_QW_LM_HEAD: m->lm_head = off; break;
        case LK_QW_INPUT_NORM: L->in = off; break;
        case LK_QW_Q_PROJ: L->q = off; break;
        case LK_QW_K_PROJ: L->k = off; break;
        case LK_QW_V_PROJ: L->v = off; break;
        case LK_QW_O_PROJ: L->o = off; break;
        case LK_QW_Q_NORM: L->qn = off; break;
        case LK_QW_K_NORM: L->kn = off; break;
        case LK_QW_POST_ATTN_NORM: L->post = off; break;
        case LK_QW_MLP_GATE_PROJ: L->gate_up = off; break;
        case LK_QW_MLP_DOWN_PROJ: L->down = off; break;
        case LK_QW_ROUTER:   /* the experts' stacks follow the router */
            L->router = off;
            L->gate_up = gu = cur = align16(cur);
            cur += m->E * 2 * m->Ie * m->H;
            L->down = dn = cur = align16(cur);
            cur += m->E * m->H * m->Ie;
            break;
        default: break;
        }
        if (L && (L->first == 0 || off < L->first)) L->first = off;   /* 0 is the embedding's, never a layer's */
        p->value.ndim = ndim;   /* data filled once the buffers exist */
        p->value.shape[0] = shape[0];
        p->value.shape[1] = shape[1];
        p->value.stride[0] = off;   /* parked here until then */
    }
    free(refs);
    if (s) return s;
    if (c->tie_word_embeddings) m->lm_head = m->embed;
    m->n_params = (int)n;
    m->n_floats = align16(cur);
    size_t bytes;   /* the count is checked by lk_qwen3_param_count; the padding and the bytes here */
    if ((s = lk_checked_bytes("model: the parameters", m->n_floats, 2 * sizeof(float), &bytes))) return s;
    if (m->dev->type == LK_DEVICE_CPU && (s = lk_check_fits_memory("model: the weights and their gradients", bytes)))
        return s;
    m->gdt = LK_F32, m->gs = sizeof(float);
    m->w = m->dev->alloc((size_t)m->n_floats * sizeof(float));   /* zeroed */
    m->g = m->dev->alloc((size_t)m->n_floats * sizeof(float));
    if (!m->w || !m->g) return lk_error(LK_ENOMEM, "model: %lld parameters: out of memory", (long long)m->n_floats);
    for (int i = 0; i < m->n_params; i++) {
        lk_param *p = &m->params[i];
        int64_t off = p->value.stride[0], shape[2] = {p->value.shape[0], p->value.shape[1]};
        p->value = lk_on(m, lk_tensor_view(m->w + off, LK_F32, p->value.ndim, shape));
        p->grad = lk_on(m, lk_tensor_view(lk_gc(m, off), LK_F32, p->value.ndim, shape));
    }
    return LK_OK;
}

/* Parameter i's offset in the flat buffers (its gradient's view is always there). */
static int64_t param_off(const lk_model *m, int i) {
    return (int64_t)(((const char *)m->params[i].grad.data - (const char *)m->g) / m->gs);
}

/* Parameter i's value viewed where a master of its dtype holds it (the f32 master, or the
 * bf16 values themselves). */
static lk_tensor master_view(const lk_model *m, int i) {
    lk_tensor t = m->params[i].grad;
    if (m->w) t.data = m->w + param_off(m, i), t.dtype = LK_F32;
    else t.data = lk_wc(m, param_off(m, i)), t.dtype = m->dt;
    return t;
}

/* Parameter i viewed in host memory as f32: the values themselves where they are f32 on
 * the CPU, else its place in host, a host copy of the whole buffer. */
static lk_tensor host_view(const lk_model *m, int i, float *host) {
    lk_tensor t = m->params[i].grad;
    t.data = host ? host + param_off(m, i) : m->params[i].value.data;
    t.dtype = LK_F32;
    t.device = (lk_device){LK_DEVICE_CPU, 0};
    return t;
}

lk_status lk_qwen3_params_move_grads(lk_model *m, lk_dtype dt) {
    void *g = m->dev->alloc((size_t)m->n_floats * lk_dtype_size(dt));   /* zeroed */
    if (!g) return lk_error(LK_ENOMEM, "model_set_grad_dtype: %s: %lld gradients: out of %s memory", lk_dtype_name(dt),
                            (long long)m->n_floats, lk_device_name(m->dev->type));
    for (int i = 0; i < m->n_params; i++) {   /* the offsets from the old buffer, before it goes */
        lk_tensor *t = &m->params[i].grad;
        t->data = (char *)g + (size_t)param_off(m, i) * lk_dtype_size(dt);
        t->dtype = dt;
    }
    m->dev->free(m->g);
    m->g = g, m->gdt = dt, m->gs = lk_dtype_size(dt);
    m->experts_unwritten = 0;   /* the new buffer is zeros */
    return LK_OK;
}

/* A host copy of the values in f32 (NULL on the CPU with an f32 master, where none is
 * needed); fetch: filled from the model, else zeroed. */
static lk_status host_copy(const lk_model *m, int fetch, float **out) {
    *out = NULL;
    if (m->w && m->dev->type == LK_DEVICE_CPU) return LK_OK;
    size_t n = (size_t)m->n_floats;
    float *h = calloc(n, sizeof(float));
    if (!h) return lk_error(LK_ENOMEM, "model: a host copy of %lld parameters: out of memory", (long long)m->n_floats);
    lk_status s = LK_OK;
    if (fetch && m->w) {
        s = m->dev->get(h, m->w, n * sizeof(float));
    } else if (fetch) {   /* the bf16 values, widened */
        uint16_t *b = malloc(n * 2);
        s = b ? m->dev->get(b, m->wc, n * 2) : lk_error(LK_ENOMEM, "model: a host copy of %lld parameters: out of "
                                                        "memory", (long long)m->n_floats);
        if (!s) lk_convert(b, LK_BF16, h, LK_F32, (int64_t)n);
        free(b);
    }
    if (s) { free(h); return s; }
    *out = h;
    return LK_OK;
}

/* host (a host_copy) back into the model: the f32 master, or rounded to nearest even into
 * the bf16 values. */
static lk_status host_put(lk_model *m, const float *host) {
    size_t n = (size_t)m->n_floats;
    if (!host) return LK_OK;
    if (m->w) return m->dev->put(m->w, host, n * sizeof(float));
    uint16_t *b = malloc(n * 2);
    if (!b) return lk_error(LK_ENOMEM, "model: a bf16 copy of %lld parameters: out of memory", (long long)m->n_floats);
    lk_convert(host, LK_F32, b, LK_BF16, (int64_t)n);
    lk_status s = m->dev->put(m->wc, b, n * 2);
    free(b);
    return s;
}

/* The f32 master freed into the bf16 copy (rounded there on the device: the free waits for
 * it), or made again from it (widened on the host); the views follow. */
lk_status lk_qwen3_params_move_master(lk_model *m, lk_dtype dt) {
    lk_status s = LK_OK;
    if (dt == LK_BF16) {
        if ((s = m->dev->round(m->wc, m->w, m->n_floats, m->dt, &m->ctx))) return s;
        m->dev->free(m->w);
        m->w = NULL;
    } else {
        float *host = NULL, *w = m->dev->alloc((size_t)m->n_floats * sizeof(float));
        if (!w) return lk_error(LK_ENOMEM, "model_set_master_dtype: f32: %lld parameters: out of %s memory",
                                (long long)m->n_floats, lk_device_name(m->dev->type));
        if (!(s = host_copy(m, 1, &host))) {   /* widened from the bf16 values, then put into the new master */
            m->w = w;
            s = host_put(m, host);
        }
        free(host);
        if (s) { m->dev->free(w); m->w = NULL; return s; }
    }
    for (int i = 0; i < m->n_params; i++) m->params[i].value = master_view(m, i);
    return LK_OK;
}

lk_status lk_qwen3_params_init(lk_model *m, uint64_t seed) {
    lk_status s = layout(m);
    if (s) return s;
    float *host;
    if ((s = host_copy(m, 0, &host))) return s;
    lk_rng rng = lk_rng_make(seed);   /* drawn on the host: the same weights on every device */
    for (int i = 0; i < m->n_params; i++) {
        lk_tensor v = host_view(m, i, host);
        int64_t n = lk_tensor_numel(&v);
        if (v.ndim == 1) {       /* norm weights start at 1 */
            for (int64_t j = 0; j < n; j++) ((float *)v.data)[j] = 1.0f;
        } else {
            lk_rng_normal(&rng, v.data, n, 0.0f, (float)m->cfg.initializer_range);
        }
    }
    s = host_put(m, host);
    free(host);
    return s;
}

int lk_model_param_count(const lk_model *m) { return m ? m->n_params : 0; }

/* The MoE layers' expert stacks in m->g, as [start, end) element ranges, in layer order
 * (gate_up then down each); their count. None under EP, where the moe_dispatch op
 * accumulates a rank's experts. */
static int expert_ranges(const lk_model *m, int64_t (*r)[2]) {
    int n = 0;
    for (int l = 0; m->ep == NULL && l < m->cfg.num_hidden_layers; l++) {
        const lk_layer *L = &m->layers[l];
        if (!L->moe) continue;
        r[n][0] = L->gate_up, r[n][1] = L->gate_up + m->E * 2 * m->Ie * m->H, n++;
        r[n][0] = L->down, r[n][1] = L->down + m->E * m->H * m->Ie, n++;
    }
    return n;
}

static int by_start(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* The gradients reached before a backward wrote the experts': zeros, as zero_grad promised. */
static void experts_zeroed(lk_model *m) {
    if (!m->experts_unwritten) return;
    int64_t (*r)[2] = malloc(sizeof *r * 2 * (size_t)m->n_moe_layers);
    if (!r) {   /* no room for the ranges: all of them, as zero_grad once did */
        m->dev->zero(m->g, (size_t)m->n_floats * m->gs, &m->ctx);
    } else {
        int k = expert_ranges(m, r);
        for (int i = 0; i < k; i++) m->dev->zero(lk_gc(m, r[i][0]), (size_t)(r[i][1] - r[i][0]) * m->gs, &m->ctx);
    }
    m->experts_unwritten = 0;
    free(r);
}

void *lk_model_grads(lk_model *m, int64_t *n) {
    if (n) *n = m ? m->n_floats : 0;
    if (m) experts_zeroed(m);
    return m ? m->g : NULL;
}

lk_param *lk_model_param(lk_model *m, int i) {
    if (!m || i < 0 || i >= m->n_params) return NULL;
    experts_zeroed(m);   /* its grad may be read */
    return &m->params[i];
}

void *lk_model_param_copy(lk_model *m, int i) {
    if (!m || i < 0 || i >= m->n_params || !m->w || m->wc == (void *)m->w) return NULL;
    return lk_wc(m, param_off(m, i));
}

void lk_model_copy_is_current(lk_model *m) {
    if (m) m->copy_current = 1;
}

/* Zeros every gradient but the experts' stacks, which the next backward writes instead
 * (most of a MoE model's parameters: no zeroing pass, and their weight-gradient GEMMs
 * store where they would read and add). Until then lk_model_grads() and lk_model_param()
 * zero them first. */
void lk_model_zero_grad(lk_model *m) {
    if (!m) return;
    int64_t (*r)[2] = m->n_moe_layers ? malloc(sizeof *r * 2 * (size_t)m->n_moe_layers) : NULL;
    int k = r ? expert_ranges(m, r) : 0;
    if (k > 1) qsort(r, (size_t)k, sizeof *r, by_start);
    int64_t at = 0;
    for (int i = 0; i <= k; i++) {   /* the gaps between the stacks, and after the last */
        int64_t end = i < k ? r[i][0] : m->n_floats;
        if (end > at) m->dev->zero(lk_gc(m, at), (size_t)(end - at) * m->gs, &m->ctx);
        if (i < k) at = r[i][1];
    }
    m->experts_unwritten = k > 0;
    free(r);
}

static lk_status join(char *buf, size_t n, const char *dir, const char *file) {
    if ((size_t)snprintf(buf, n, "%s/%s", dir, file) >= n)
        return lk_error(LK_EINVAL, "model: dir: path too long: '%s'", dir);
    return LK_OK;
}

lk_status lk_model_save(const lk_model *m, const char *dir) {
    return lk_model_save_sharded(m, dir, LK_ST_DEFAULT_MAX_SHARD);
}

lk_status lk_model_save_sharded(const lk_model *m, const char *dir, uint64_t max_shard_bytes) {
    if (!m || !dir || !dir[0]) return lk_error(LK_EINVAL, "model_save: expected a model and a directory");
    lk_dtype as;
    if (strcmp(m->cfg.torch_dtype, "bfloat16") == 0) as = LK_BF16;
    else if (strcmp(m->cfg.torch_dtype, "float32") == 0) as = LK_F32;
    else return lk_error(LK_EINVAL, "model_save: torch_dtype: expected bfloat16 or float32, got '%s'", m->cfg.torch_dtype);
    if (max_shard_bytes == 0)
        return lk_error(LK_EINVAL, "model_save: max_shard_bytes: expected at least 1 byte, got 0");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return lk_error(LK_EIO, "model_save: %s: %s", dir, strerror(errno));
    char path[4096];
    float *host;
    lk_status s = host_copy(m, 1, &host);
    if (s) return s;
    lk_st_entry *e = malloc((size_t)m->n_params * sizeof *e);
    if (!e) { free(host); return lk_error(LK_ENOMEM, "model_save: out of memory"); }
    for (int i = 0; i < m->n_params; i++)   /* the checkpoint's order, as a state_dict's */
        e[i] = (lk_st_entry){.name = m->params[i].name, .tensor = host_view(m, i, host), .as = as};
    s = lk_st_dir_write(dir, e, (size_t)m->n_params, max_shard_bytes);   /* it reads the views: host lives until here */
    free(e);
    free(host);
    if (s) return s;
    /* the weights first: a config.json beside them says they are complete */
    if ((s = join(path, sizeof path, dir, "config.json"))) return s;
    return lk_qwen3_config_write(path, &m->cfg);
}

/* Every parameter of m in d with its shape and a float dtype, and nothing else but a tied
 * model's lm_head.weight (which transformers ignores too): checked before any weight
 * changes, so a bad checkpoint leaves m as it was. */
static lk_status check_weights(const lk_model *m, const lk_st_dir *d, const char *dir) {
    for (int i = 0; i < m->n_params; i++) {
        const lk_param *p = &m->params[i];
        const char *file = NULL;
        const lk_st_tensor *t = lk_st_dir_find(d, p->name, &file);
        char want[64], got[96];
        if (!t)
            return lk_error(LK_EIO, "model_load_weights: %s: no tensor '%s' (%s)", dir, p->name,
                            lk_st_dir_sharded(d) ? "in the index's weight_map" : "model.safetensors");
        int same = t->ndim == p->value.ndim;
        for (int k = 0; same && k < t->ndim; k++) same = t->shape[k] == p->value.shape[k];
        if (!same) {
            int n = snprintf(got, sizeof got, "[");
            for (int k = 0; k < t->ndim && n < (int)sizeof got; k++)
                n += snprintf(got + n, sizeof got - n, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
            if (n < (int)sizeof got) snprintf(got + n, sizeof got - n, "]");
            return lk_error(LK_ESHAPE, "model_load_weights: %s: '%s': expected shape %s for the run's model, got %s", file,
                            p->name, lk_shape_str(&p->value, want, sizeof want), got);
        }
        if (t->dtype != LK_F32 && t->dtype != LK_BF16 && t->dtype != LK_F16)
            return lk_error(LK_EDTYPE, "model_load_weights: %s: '%s': expected F32, BF16 or F16, got %s", file, p->name,
                            t->st_dtype);
    }
    size_t n = lk_st_dir_count(d), want_n = (size_t)m->n_params;
    for (size_t i = 0; n > want_n && i < n; i++) {
        const char *file = NULL;
        const lk_st_tensor *t = lk_st_dir_at(d, i, &file);
        if (m->cfg.tie_word_embeddings && strcmp(t->name, "lm_head.weight") == 0) { want_n++; continue; }
        int known = 0;
        for (int k = 0; !known && k < m->n_params; k++) known = strcmp(m->params[k].name, t->name) == 0;
        if (!known)
            return lk_error(LK_EIO, "model_load_weights: %s: tensor '%s' is not a parameter of the model "
                            "config.json describes (%zu tensors, expected %d)", file, t->name, n, m->n_params);
    }
    return LK_OK;
}

lk_status lk_model_check_weights(const lk_model *m, const char *dir) {
    if (!m || !dir) return lk_error(LK_EINVAL, "model_check_weights: expected a model and a directory");
    lk_st_dir *d;
    lk_status s = lk_st_dir_open(dir, &d);
    if (s) return s;
    s = check_weights(m, d, dir);
    lk_st_dir_close(d);
    return s;
}

lk_status lk_model_load_weights(lk_model *m, const char *dir) {
    if (!m || !dir) return lk_error(LK_EINVAL, "model_load_weights: expected a model and a directory");
    lk_st_dir *d = NULL;
    lk_status s = lk_st_dir_open(dir, &d);
    if (s) return s;
    s = check_weights(m, d, dir);
    float *host = NULL;
    if (!s) s = host_copy(m, 1, &host);   /* untied pieces of the buffer keep their values */
    for (int i = 0; i < m->n_params && !s; i++) {
        lk_tensor v = host_view(m, i, host);
        s = lk_st_dir_read(d, m->params[i].name, &v);
    }
    lk_st_dir_close(d);
    if (!s) s = host_put(m, host);
    free(host);
    return s;
}
