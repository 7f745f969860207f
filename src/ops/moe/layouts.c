/* layouts.c — the two expert weight layouts and the copies between them (moe.h):
 * per-expert gate_proj / up_proj [I, H] and down_proj [H, I] (the hub checkpoints'
 * mlp.experts.{e}.*.weight) and the stacked gate_up [E, 2I, H] / down [E, H, I] of
 * transformers 5, which the experts op takes. Used by checkpoint loading and saving. */
#include <stdio.h>
#include <string.h>
#include "ops/validate.h"
#include "llmkern/moe.h"

#define OP "moe_layout"

/* Every per-expert tensor and both stacked ones agree; fills I, H. */
static lk_status check_layouts(int n, const lk_tensor *gate, const lk_tensor *up, const lk_tensor *down,
                               const lk_tensor *gu, const lk_tensor *dn) {
    if (n < 1 || !gate || !up || !down || !gu || !dn)
        return lk_error(LK_EINVAL, OP ": n_experts: expected E >= 1 and every tensor given, got E = %d", n);
    lk_status s;
    if ((s = lk_expect_present(OP, "gate_up", gu)) || (s = lk_expect_contiguous(OP, "gate_up", gu, 3)) ||
        (s = lk_expect_dtype(OP, "gate_up", gu, LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))))
        return s;
    char buf[96];
    if (gu->ndim != 3 || gu->shape[0] != n || gu->shape[1] < 2 || gu->shape[1] % 2)
        return lk_error(LK_ESHAPE, OP ": gate_up: expected shape [%d, 2I, H], got %s", n, lk_shape_str(gu, buf, sizeof buf));
    int64_t I = gu->shape[1] / 2, H = gu->shape[2], ih[2] = {I, H}, hi[2] = {H, I}, ehi[3] = {n, H, I};
    if ((s = lk_expect_present(OP, "down", dn)) || (s = lk_expect_contiguous(OP, "down", dn, 3)) ||
        (s = lk_expect_shape(OP, "down", dn, 3, ehi)) || (s = lk_expect_dtype_eq(OP, "down", dn, gu->dtype)))
        return s;
    for (int e = 0; e < n; e++) {
        const struct { const char *name; const lk_tensor *t; const int64_t *shape; } per[3] = {
            {"gate", &gate[e], ih}, {"up", &up[e], ih}, {"down", &down[e], hi}};
        for (int k = 0; k < 3; k++) {
            char arg[48];
            snprintf(arg, sizeof arg, "%s[%d]", per[k].name, e);
            if ((s = lk_expect_present(OP, arg, per[k].t)) || (s = lk_expect_contiguous(OP, arg, per[k].t, 2)) ||
                (s = lk_expect_shape(OP, arg, per[k].t, 2, per[k].shape)) ||
                (s = lk_expect_dtype_eq(OP, arg, per[k].t, gu->dtype)))
                return s;
        }
    }
    return LK_OK;
}

static void copy_all(int n, const lk_tensor *gate, const lk_tensor *up, const lk_tensor *down, const lk_tensor *gu,
                     const lk_tensor *dn, int to_stacked) {
    size_t esz = lk_dtype_size(gu->dtype), ih = (size_t)(gu->shape[1] / 2 * gu->shape[2]) * esz;
    for (int e = 0; e < n; e++) {
        char *g = (char *)gu->data + (size_t)e * 2 * ih, *d = (char *)dn->data + (size_t)e * ih;
        if (to_stacked) {
            memcpy(g, gate[e].data, ih);
            memcpy(g + ih, up[e].data, ih);
            memcpy(d, down[e].data, ih);
        } else {
            memcpy(gate[e].data, g, ih);
            memcpy(up[e].data, g + ih, ih);
            memcpy(down[e].data, d, ih);
        }
    }
}

lk_status lk_moe_stack_weights(int n_experts, const lk_tensor *gate, const lk_tensor *up, const lk_tensor *down,
                               lk_tensor *gate_up, lk_tensor *down_stacked) {
    lk_status s = check_layouts(n_experts, gate, up, down, gate_up, down_stacked);
    if (!s) copy_all(n_experts, gate, up, down, gate_up, down_stacked, 1);
    return s;
}

lk_status lk_moe_unstack_weights(int n_experts, const lk_tensor *gate_up, const lk_tensor *down_stacked,
                                 lk_tensor *gate, lk_tensor *up, lk_tensor *down) {
    lk_status s = check_layouts(n_experts, gate, up, down, gate_up, down_stacked);
    if (!s) copy_all(n_experts, gate, up, down, gate_up, down_stacked, 0);
    return s;
}
