/* fused.c — `fused` RoPE on the CPU: one pass over q and k each way.
 *
 * Each (b, h, s) row of q and k is read once and written once: its position picks a
 * row of the f32 cos/sin tables, the two halves of the rotated part are loaded sixteen
 * lanes at a time, rotated in f32 and stored (bf16 rounded once), and the dims past
 * rotary_dim are copied unless the call is in place. The backward is the same loop
 * with sin negated (rotation by the negative angle is the transpose). Rows of q and
 * then k form one static OpenMP loop, so both tensors share one team and one barrier.
 * Nothing is saved and no workspace is needed. Every element of a row is loaded before
 * the same element is stored, so the output may be the input itself.
 *
 * Reached through lk_rope_forward / lk_rope_backward (rope.c), which have validated
 * every argument, position ids included. */
#include "internal.h"
#include "ops/rope/row.h"

/* Outputs larger than this are streamed past the caches: nobody reads them back
 * before they are evicted, and a streaming store skips the read of each destination
 * line an ordinary store costs (3 passes instead of 4 per tensor). */
#define FUSED_NT_BYTES ((size_t)16 << 20)
/* Fewer elements than this run on one thread: waking the team costs more. */
#define FUSED_PAR_MIN ((int64_t)1 << 15)

#define INLINE static inline __attribute__((always_inline))

/* Streaming needs every full 16-lane store aligned: rows and halves in whole vectors. */
static int use_streaming(const void *in, const void *out, const lk_rope_dims *d, int64_t heads) {
    size_t esz = lk_dtype_size(d->dtype), bytes = (size_t)(d->batch * heads * d->seq * d->head_dim) * esz;
    return LK_V16_NATIVE && in != out && bytes >= FUSED_NT_BYTES && (d->rotary_dim / 2) % 16 == 0 &&
           d->head_dim % 16 == 0 && ((size_t)d->head_dim * esz) % 64 == 0 && (uintptr_t)out % 64 == 0;
}

typedef struct {
    const char *x;
    char *y;
    int64_t heads;
    int nt;
} plane;

INLINE void rotate_all(const lk_rope_args *a, const lk_rope_dims *d, const plane pl[2], float sign, lk_dtype dt) {
    int64_t S = d->seq, D = d->head_dim, h = d->rotary_dim / 2;
    int64_t nq = d->batch * pl[0].heads * S, total = nq + d->batch * pl[1].heads * S;
    size_t rb = (size_t)D * lk_dtype_size(dt);
    const float *cos_t = a->cos.data, *sin_t = a->sin.data;
    const lk_tensor *ids = &a->position_ids;
    lk_v16 vsign = lk_v16_set1(sign);
    int nt = pl[0].nt || pl[1].nt;
    #pragma omp parallel if (total * D >= FUSED_PAR_MIN)
    {
        #pragma omp for schedule(static) nowait
        for (int64_t r = 0; r < total; r++) {
            int t = r >= nq;
            int64_t rr = t ? r - nq : r, b = rr / (pl[t].heads * S), s = rr % S;
            int64_t p = lk_rope_pos(ids, b, s, S);
            lk_rope_row(pl[t].x + rr * rb, pl[t].y + rr * rb, cos_t + p * h, sin_t + p * h, vsign, dt, h, D,
                       pl[t].nt);
        }
        if (nt) lk_v16_fence();
    }
}

static lk_status run(const lk_rope_args *a, const void *xq, void *yq, const void *xk, void *yk, float sign) {
    lk_rope_dims d = lk_rope_dims_of(a);
    plane pl[2] = {
        {xq, yq, d.q_heads, use_streaming(xq, yq, &d, d.q_heads)},
        {xk, yk, d.k_heads, use_streaming(xk, yk, &d, d.k_heads)},
    };
    if (d.dtype == LK_F32) rotate_all(a, &d, pl, sign, LK_F32);
    else rotate_all(a, &d, pl, sign, LK_BF16);
    return LK_OK;
}

static size_t fused_saved_bytes(const lk_rope_dims *d) { return 0; }

static lk_status fused_forward(const lk_rope_args *a, lk_ctx *ctx) {
    return run(a, a->q.data, a->q_out.data, a->k.data, a->k_out.data, 1.0f);
}

static lk_status fused_backward(const lk_rope_args *a, lk_ctx *ctx) {
    return run(a, a->dq_out.data, a->dq.data, a->dk_out.data, a->dk.data, -1.0f);
}

const lk_rope_vtable lk_rope_fused_vtable = {
    .version = LK_ROPE_VTABLE_VERSION,
    .saved_bytes = fused_saved_bytes,
    .forward = fused_forward,
    .backward = fused_backward,
};
