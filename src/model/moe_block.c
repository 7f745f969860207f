/* moe_block.c — the Qwen3-MoE sparse block of one layer: the router op picks each
 * token's top-k experts and weights (and the load-balancing aux loss, over the SP
 * group's tokens), the experts op runs and sums them — under expert parallelism through
 * the moe_dispatch op over the EP group, on this rank's slice of the expert stacks.
 * Backward: experts first (d_hidden and d_topk_weights), then the router from
 * d_topk_weights and the aux coefficient; the two d_hidden are summed. */
#include "model/qwen3_internal.h"

static lk_tensor t2(const lk_model *m, const void *p, lk_dtype dt, int64_t r, int64_t c) {
    return lk_on(m, lk_tensor_2d((void *)p, dt, r, c));
}
static lk_tensor t3(const lk_model *m, const void *p, lk_dtype dt, int64_t a, int64_t b, int64_t c) {
    return lk_on(m, lk_tensor_view((void *)p, dt, 3, (int64_t[]){a, b, c}));
}

static lk_moe_router_args router_args(lk_model *m, int l, const lk_layer_acts *a) {
    const lk_layer *L = &m->layers[l];
    return (lk_moe_router_args){
        .hidden = t2(m, a->h2, m->dt, m->T, m->H), .gate_weight = t2(m, lk_wc(m, L->router), m->dt, m->E, m->H),
        .topk_ids = t2(m, a->ids, LK_I32, m->T, m->K), .topk_weights = t2(m, a->tw, LK_F32, m->T, m->K),
        .saved = {a->s[S_ROUTER], L->saved[S_ROUTER]},
        .n_experts = (int)m->E, .top_k = (int)m->K, .norm_topk_prob = m->cfg.norm_topk_prob,
        .noise = m->router.noise, .gate_f32 = m->router.gate_f32,
    };
}

static lk_moe_experts_args experts_args(lk_model *m, int l, const lk_layer_acts *a, void *out) {
    const lk_layer *L = &m->layers[l];
    return (lk_moe_experts_args){
        .hidden = t2(m, a->h2, m->dt, m->T, m->H), .topk_ids = t2(m, a->ids, LK_I32, m->T, m->K),
        .topk_weights = t2(m, a->tw, LK_F32, m->T, m->K),
        .gate_up_weight = t3(m, lk_wc(m, L->gate_up), m->dt, m->E, 2 * m->Ie, m->H),
        .down_weight = t3(m, lk_wc(m, L->down), m->dt, m->E, m->H, m->Ie),
        .out = t2(m, out, m->dt, m->T, m->H), .saved = {a->s[S_EXPERTS], L->saved[S_EXPERTS]},
    };
}

/* Under EP: this rank's experts [e0, e0 + n) of the stacks: the compute weights, or
 * (grads) the gradients. */
static lk_moe_dispatch_args dispatch_args(lk_model *m, int l, const lk_layer_acts *a, int grads) {
    const lk_layer *L = &m->layers[l];
    int64_t n = m->E / m->ep->size, e0 = m->ep->rank * n, gu = L->gate_up + e0 * 2 * m->Ie * m->H,
            dn = L->down + e0 * m->H * m->Ie;
    lk_dtype dt = grads ? m->gdt : m->dt;
    lk_moe_dispatch_args d = {
        .hidden = t2(m, a->h2, m->dt, m->T, m->H), .topk_ids = t2(m, a->ids, LK_I32, m->T, m->K),
        .topk_weights = t2(m, a->tw, LK_F32, m->T, m->K),
        .gate_up_weight = t3(m, grads ? lk_gc(m, gu) : lk_wc(m, gu), dt, n, 2 * m->Ie, m->H),
        .down_weight = t3(m, grads ? lk_gc(m, dn) : lk_wc(m, dn), dt, n, m->H, m->Ie),
        .n_experts = (int)m->E, .experts = L->ops.experts,
    };
    return d;
}

lk_status lk_qwen3_moe_saved(const lk_model *m, int l, int64_t T, size_t *router, size_t *experts) {
    const lk_layer *L = &m->layers[l];
    lk_status s = lk_moe_router_saved_bytes(L->ops.router, T, m->E, m->K, router);
    *experts = 0;   /* the dispatcher keeps nothing: its backward redoes the exchange */
    return s || m->ep ? s : lk_moe_experts_saved_bytes(L->ops.experts, T, m->K, m->E, m->H, m->Ie, m->dt, experts);
}

lk_status lk_qwen3_moe_forward(lk_model *m, int l, const lk_layer_acts *a, void *out, int add_aux) {
    lk_moe_router_args r = router_args(m, l, a);
    r.aux_loss = lk_on(m, lk_tensor_1d(m->scal + 2, LK_F32, 1));
    m->ctx.comm = m->sp;   /* the aux loss over the SP group's tokens */
    lk_status s = lk_moe_router_forward(m->layers[l].ops.router, &r, &m->ctx);
    m->ctx.comm = NULL;
    /* summed on the device: no read back a layer (the forward reads the sum once) */
    if (s || (add_aux && (s = m->dev->acc(m->scal + 3, LK_F32, m->scal + 2, LK_F32, 1, &m->ctx)))) return s;
    if (m->ep) {   /* the dispatcher keeps nothing: a recompute (out NULL) has nothing to make again */
        if (!out) return LK_OK;
        lk_moe_dispatch_args d = dispatch_args(m, l, a, 0);
        d.out = t2(m, out, m->dt, m->T, m->H);
        m->ctx.comm = m->ep;
        s = lk_moe_dispatch_forward(m->dispatch, &d, &m->ctx);
        m->ctx.comm = NULL;
        return s;
    }
    lk_moe_experts_args e = experts_args(m, l, a, out);
    return lk_moe_experts_forward(m->layers[l].ops.experts, &e, &m->ctx);
}

lk_status lk_qwen3_moe_backward(lk_model *m, int l, const lk_layer_acts *a, const void *dout, void *dx,
                                float d_aux) {
    const lk_layer *L = &m->layers[l];
    lk_tensor dtw = t2(m, m->sc.dtw, LK_F32, m->T, m->K);
    lk_status s;
    if (m->ep) {
        lk_moe_dispatch_args d = dispatch_args(m, l, a, 0), g = dispatch_args(m, l, a, 1);
        d.dout = t2(m, dout, m->dt, m->T, m->H);
        d.d_hidden = t2(m, dx, m->dt, m->T, m->H);
        d.d_topk_weights = dtw;
        d.d_gate_up_weight = g.gate_up_weight;
        d.d_down_weight = g.down_weight;
        m->ctx.comm = m->ep;
        s = lk_moe_dispatch_backward(m->dispatch, &d, &m->ctx);
        m->ctx.comm = NULL;
    } else {
        lk_moe_experts_args e = experts_args(m, l, a, NULL);
        /* recompute_moe: the saved block made again by the forward, alone (out NULL): the
         * forward's bits, its kernels being deterministic */
        if (lk_moe_again(m, l) && (s = lk_moe_experts_forward(L->ops.experts, &e, &m->ctx))) return s;
        e.dout = t2(m, dout, m->dt, m->T, m->H);
        e.d_hidden = t2(m, dx, m->dt, m->T, m->H);
        e.d_topk_weights = dtw;
        e.d_gate_up_weight = t3(m, lk_gc(m, L->gate_up), m->gdt, m->E, 2 * m->Ie, m->H);
        e.d_down_weight = t3(m, lk_gc(m, L->down), m->gdt, m->E, m->H, m->Ie);
        e.write_weight_grads = m->experts_unwritten;   /* the step's first backward: written, not added */
        s = lk_moe_experts_backward(L->ops.experts, &e, &m->ctx);
    }
    if (s) return s;
    lk_moe_router_args r = router_args(m, l, a);
    r.d_topk_weights = dtw;
    r.d_aux_loss = d_aux;
    r.d_hidden = t2(m, m->sc.dh2, m->dt, m->T, m->H);
    r.d_gate_weight = t2(m, lk_gc(m, L->router), m->gdt, m->E, m->H);
    m->ctx.comm = m->sp;
    s = lk_moe_router_backward(L->ops.router, &r, &m->ctx);
    m->ctx.comm = NULL;
    return s ? s : m->dev->add(dx, dx, m->sc.dh2, m->T * m->H, m->dt, &m->ctx);
}
