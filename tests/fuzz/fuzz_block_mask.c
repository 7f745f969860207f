/* fuzz_block_mask.c — the BlockMask builders on raw 64-bit sizes (issue 20, item 2:
 * B*H*nq*nk once overflowed int64 and wrapped the buffer to 64 bytes). The input is
 * seven int64s: B, H, Q_LEN, KV_LEN, q_block, kv_block, window, taken as they are, then
 * a selector. Sizes whose work fits in 64 bits but is large (a legitimate mask that
 * takes long to build) are skipped; every other input, overflowing ones included, must
 * return, and a built mask must be consistent. */
#include "fuzz_util.h"

static bool cheap(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx) {
    (void)ctx;
    return ((q ^ kv) + b + h) % 3 != 0;
}

/* a * b ... over n factors; 0 when it overflows (or a factor is out of range) */
static uint64_t prod(const int64_t *f, int n) {
    uint64_t p = 1;
    for (int i = 0; i < n; i++)
        if (f[i] < 1 || __builtin_mul_overflow(p, (uint64_t)f[i], &p)) return 0;
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 7 * 8 + 1) return 0;
    int64_t v[7];
    memcpy(v, data, sizeof v);
    int64_t B = v[0], H = v[1], Q = v[2], KV = v[3], qb = v[4], kb = v[5], window = v[6];
    int64_t qbs = qb ? qb : 128, kbs = kb ? kb : 128;
    int64_t nq = qbs > 0 && Q > 0 ? Q / qbs + (Q % qbs != 0) : 0, nk = kbs > 0 && KV > 0 ? KV / kbs + (KV % kbs != 0) : 0;
    int64_t elems[4] = {B, H, Q, KV}, cells[4] = {B, H, nq, nk};
    uint64_t work = prod(elems, 4), blocks = prod(cells, 4);
    if ((work && work > (1u << 18)) || (blocks && blocks > (1u << 14))) return 0;   /* fits, but large: skip */
    lk_block_mask m;
    memset(&m, 0, sizeof m);
    lk_status s;
    switch (data[56] % 4) {
    case 0: s = lk_block_mask_create(cheap, NULL, B, H, Q, KV, qb, kb, &m); break;
    case 1: s = lk_block_mask_causal(B, H, Q, KV, qb, kb, &m); break;
    case 2: s = lk_block_mask_sliding_window(window, B, H, Q, KV, qb, kb, &m); break;
    default: {
        int64_t pre[4] = {window, window / 2, 3, 0};
        s = B >= 1 && B <= 4 ? lk_block_mask_prefix_lm(pre, B, H, Q, KV, qb, kb, &m) : LK_EINVAL;
    }
    }
    fuzz_expect_status(s);
    if (s) return 0;
    if (m.num_q_blocks != nq || m.num_kv_blocks != nk) abort();
    for (int64_t r = 0; r < m.B * m.H * m.num_q_blocks; r++)
        if (m.kv_num_blocks[r] + m.full_kv_num_blocks[r] > m.num_kv_blocks) abort();
    double d = lk_block_mask_density(&m);
    if (!(d >= 0.0 && d <= 1.0)) abort();
    lk_block_mask_free(&m);
    return 0;
}
