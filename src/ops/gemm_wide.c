/* gemm_wide.c — the two f32 GEMMs of a chunked LM head, against a wide weight W read
 * where it lies (see gemm.h): logits = X·Wᵀ and dX = G·W for a chunk of a few hundred
 * tokens, W [V, k] with V in the tens of thousands. Tested by tests/test_gemm_wide.c.
 *
 * Why not BLAS: OpenBLAS packs all of W for each call, ~17-20 ms per 125 MiB W at the
 * fused cross-entropy's chunks on this project's 2-core Zen 4, and the fused loss makes
 * two such calls a chunk (bench/NOTES.md, issue 3). Here W is never packed as a whole.
 * logits: a register tile of MR_L rows of W by NR_L tokens broadcasts W's elements
 * straight from its rows (a stream per row, each cache line used for 16 k-steps) against
 * the chunk's Xᵀ, packed once (small); the tile runs the whole k, so C is written once.
 * Eight rows at most: rows of W 4 KiB apart all map to one L1 set of 8 ways (twelve rows
 * ran at 115 GF/s, eight at 200). dX: a tile of MR_D tokens by NR_D columns of W,
 * reduced over blocks of VC rows of W; each thread copies the slices of JB column tiles
 * of a block into wp once, and every token tile reuses them from L2.
 *
 * Measured (bench/NOTES.md, issue 3's fourth look; 2 threads, FMA peak 216 GF/s): at 256
 * tokens x 32000 x 1024, logits 212-215 GF/s against OpenBLAS's 164-183, dX 194-197
 * against 186-189 (at 373 tokens); at 4096 tokens OpenBLAS is the faster (logits 204
 * against 188-191), hence lk_gemm_wide_wins.
 * Without AVX-512 the same calls go to lk_gemm. */
#include <omp.h>
#include <string.h>
#include "ops/gemm.h"

/* Measured crossovers (2 threads): OpenBLAS wins at 4096 tokens, and at a hidden size of
 * 64, where dX has one column tile for two threads (dX 99-100 GF/s against 101-128); at
 * 256 and up the wide GEMMs are as fast or faster (H 256: logits 163-175 against 166, dX
 * 186 against 170; H 2048-4096: 207-211 against 168-173, 178 against 171-176). */
#define WIDE_MAX_ROWS 1024
#define WIDE_MIN_HIDDEN 256

int lk_gemm_wide_wins(int64_t m, int64_t hidden) {
#if defined(__AVX512F__)
    return m >= 1 && m <= WIDE_MAX_ROWS && hidden >= WIDE_MIN_HIDDEN;
#else
    (void)m, (void)hidden;
    return 0;
#endif
}

#if defined(__AVX512F__)
#include <immintrin.h>

#define MR_L 8           /* rows of W a logits tile */
#define NV_L 3           /* zmm of tokens a logits tile: NR_L = 48 */
#define NR_L (16 * NV_L)
#define MR_D 6           /* tokens a dX tile */
#define NV_D 4           /* zmm of W's columns a dX tile: NR_D = 64 */
#define NR_D (16 * NV_D)
#define NV_MAX 4
#define VC 256           /* rows of W a dX block */
#define JB 2             /* column tiles a dX pass: wp is JB·VC·NR_D floats, 128 KiB */
#define VB (MR_L * 8)    /* rows of W a logits block, kept in L2 across the token tiles */

static inline __mmask16 lanes(int64_t r) { return r >= 16 ? 0xffff : r <= 0 ? 0 : (__mmask16)((1u << r) - 1u); }

size_t lk_gemm_wide_scratch_bytes(int64_t m, int64_t k) {
    return (size_t)((m + NR_L - 1) / NR_L * NR_L) * (size_t)k * sizeof(float);
}

/* The register tile both GEMMs run: acc[i][j] += Σ_s a[i][s] · b[s·NRB + 16j .. +16] for
 * s < steps; a's MR rows are read as broadcasts, b (packed, 64-byte aligned) as NV zmm a
 * step. MR, NV and NRB are constants at each call, so acc lives in registers. */
static inline __attribute__((always_inline)) void tile_fma(const int MR, const int NV, const int NRB,
                                                           __m512 acc[][NV_MAX], const float *const *a,
                                                           const float *b, int64_t steps) {
    for (int64_t q = 0; q < steps; q++, b += NRB) {
        __m512 bv[NV_MAX];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) bv[j] = _mm512_load_ps(b + 16 * j);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(a[i][q]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
        }
    }
}

/* C[n0 .. n0+nv, v0 .. v0+mr) = X Wᵀ for one tile of NV zmm of tokens (NV is a constant
 * at each call, so acc stays in registers); xp holds the tile's tokens, [k][NR_L]. */
static inline __attribute__((always_inline)) void logits_tile(const int NV, const float *w, int64_t ldw, int64_t v0,
                                                              int mr, const float *xp, int64_t k, int64_t n0, int nv,
                                                              float *c, int64_t ldc) {
    __m512 acc[MR_L][NV_MAX];
    const float *row[MR_L];
    for (int i = 0; i < MR_L; i++) {
        for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();
        row[i] = w + (v0 + (i < mr ? i : 0)) * ldw;       /* past the edge: a valid row, result dropped */
    }
    tile_fma(MR_L, NV, NR_L, acc, row, xp, k);
    /* acc holds Cᵀ: out through a small buffer, one token row of mr values at a time. */
    float t[MR_L][NR_L] __attribute__((aligned(64)));
    for (int i = 0; i < MR_L; i++)
        for (int j = 0; j < NV; j++) _mm512_store_ps(t[i] + 16 * j, acc[i][j]);
    for (int n = 0; n < nv; n++) {
        float *o = c + (n0 + n) * ldc + v0;
        for (int i = 0; i < mr; i++) o[i] = t[i][n];
    }
}

/* The last tile of a chunk may hold fewer tokens: as many zmm as it needs (at 256 tokens
 * a full-width last tile of 16 wasted a ninth of the GEMM). */
static void logits_tiles(const float *w, int64_t ldw, int64_t v0, int mr, const float *xp, int64_t k, int64_t n0,
                         int nv, float *c, int64_t ldc) {
    if (nv > 32) logits_tile(3, w, ldw, v0, mr, xp, k, n0, nv, c, ldc);
    else if (nv > 16) logits_tile(2, w, ldw, v0, mr, xp, k, n0, nv, c, ldc);
    else logits_tile(1, w, ldw, v0, mr, xp, k, n0, nv, c, ldc);
}

static void xwt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw, float *c,
                int64_t ldc, float *scratch) {
    int64_t tiles = (m + NR_L - 1) / NR_L;
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++)                  /* Xᵀ by tiles of tokens: [tile][k][NR_L] */
        for (int64_t q = 0; q < k; q++)
            for (int r = 0; r < NR_L; r++) {
                int64_t i = t * NR_L + r;
                scratch[(t * k + q) * NR_L + r] = i < m ? x[i * ldx + q] : 0.0f;
            }
    #pragma omp parallel for schedule(static)
    for (int64_t vb = 0; vb < n; vb += VB) {
        int64_t ve = vb + VB < n ? vb + VB : n;
        for (int64_t t = 0; t < tiles; t++) {
            int nv = m - t * NR_L < NR_L ? (int)(m - t * NR_L) : NR_L;
            for (int64_t v0 = vb; v0 < ve; v0 += MR_L)
                logits_tiles(w, ldw, v0, ve - v0 < MR_L ? (int)(ve - v0) : MR_L, scratch + t * k * NR_L, k,
                             t * NR_L, nv, c, ldc);
        }
    }
}

/* C[r0 .. r0+mr, j0 .. j0+NR_D) (+)= G[rows, v0 .. v0+vc) · wp, wp = W's slice [vc][NR_D]. */
static void dx_tile(const float *g, int64_t ldg, int64_t v0, int vc, const float *wp, int64_t r0, int mr,
                    int64_t j0, int64_t cols, float *c, int64_t ldc, int first) {
    __m512 acc[MR_D][NV_MAX];
    const float *grow[MR_D];
    __mmask16 mk[NV_D];
    for (int j = 0; j < NV_D; j++) mk[j] = lanes(cols - 16 * j);
    for (int i = 0; i < MR_D; i++) {
        int64_t r = r0 + (i < mr ? i : 0);
        grow[i] = g + r * ldg + v0;
        for (int j = 0; j < NV_D; j++)
            acc[i][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[j], c + r * ldc + j0 + 16 * j);
    }
    tile_fma(MR_D, NV_D, NR_D, acc, grow, wp, vc);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NV_D; j++) _mm512_mask_storeu_ps(c + (r0 + i) * ldc + j0 + 16 * j, mk[j], acc[i][j]);
}

static void gw(int64_t m, int64_t n, int64_t k, const float *g, int64_t ldg, const float *w, int64_t ldw, float *c,
               int64_t ldc) {
    int64_t tiles = (n + NR_D - 1) / NR_D;
    #pragma omp parallel
    {
        /* A thread owns whole columns of C, JB column tiles at a time: for each block of
         * W's rows their slices are copied into wp once, and every token tile runs over
         * all JB of them, so C's [m, JB·NR_D] and G's [m, VC] stay in L2. (One tile at a
         * time reads G from DRAM once per tile; blocks outermost with all of a thread's
         * columns re-reads C from L3 every block.) */
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t ta = tiles * id / nt, tb = tiles * (id + 1) / nt;
        float wp[JB][VC * NR_D] __attribute__((aligned(64)));
        for (int64_t g0 = ta; g0 < tb; g0 += JB) {
            int nj = tb - g0 < JB ? (int)(tb - g0) : JB;
            for (int64_t v0 = 0; v0 < k; v0 += VC) {
                int vc = k - v0 < VC ? (int)(k - v0) : VC;
                for (int jt = 0; jt < nj; jt++) {
                    int64_t j0 = (g0 + jt) * NR_D, cols = n - j0 < NR_D ? n - j0 : NR_D;
                    for (int v = 0; v < vc; v++)
                        for (int j = 0; j < NV_D; j++)
                            _mm512_store_ps(wp[jt] + v * NR_D + 16 * j,
                                            _mm512_maskz_loadu_ps(lanes(cols - 16 * j), w + (v0 + v) * ldw + j0 + 16 * j));
                }
                for (int64_t r0 = 0; r0 < m; r0 += MR_D)
                    for (int jt = 0; jt < nj; jt++) {
                        int64_t j0 = (g0 + jt) * NR_D, cols = n - j0 < NR_D ? n - j0 : NR_D;
                        dx_tile(g, ldg, v0, vc, wp[jt], r0, m - r0 < MR_D ? (int)(m - r0) : MR_D, j0, cols, c, ldc,
                                v0 == 0);
                    }
            }
        }
    }
}

#else /* no AVX-512: lk_gemm_wide_wins says no, and the calls are lk_gemm's */

size_t lk_gemm_wide_scratch_bytes(int64_t m, int64_t k) { (void)m, (void)k; return 0; }

static lk_gemm_operand f32(const float *p, int64_t ld, int trans) {
    return (lk_gemm_operand){.data = p, .dtype = LK_F32, .ld = ld, .trans = trans};
}

static void xwt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw, float *c,
                int64_t ldc, float *scratch) {
    (void)scratch;
    lk_gemm(m, n, k, 1.0f, f32(x, ldx, 0), f32(w, ldw, 1), 0.0f, c, ldc, NULL);   /* f32: cannot fail */
}

static void gw(int64_t m, int64_t n, int64_t k, const float *g, int64_t ldg, const float *w, int64_t ldw, float *c,
               int64_t ldc) {
    lk_gemm(m, n, k, 1.0f, f32(g, ldg, 0), f32(w, ldw, 0), 0.0f, c, ldc, NULL);
}
#endif

/* An empty sum (k = 0) is zeros; nothing to do for an empty C. */
static int trivial(int64_t m, int64_t n, int64_t k, float *c, int64_t ldc) {
    if (m == 0 || n == 0) return 1;
    if (k > 0) return 0;
    for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
    return 1;
}

void lk_gemm_wide_xwt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                      float *c, int64_t ldc, float *scratch) {
    if (!trivial(m, n, k, c, ldc)) xwt(m, n, k, x, ldx, w, ldw, c, ldc, scratch);
}

void lk_gemm_wide_gw(int64_t m, int64_t n, int64_t k, const float *g, int64_t ldg, const float *w, int64_t ldw,
                     float *c, int64_t ldc) {
    if (!trivial(m, n, k, c, ldc)) gw(m, n, k, g, ldg, w, ldw, c, ldc);
}
