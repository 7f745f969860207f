/* check.h — one attention comparison with the float64 reference (reference.c), with
 * every option the contract has: GQA, q_len != kv_len, causal, window, softcap,
 * sinks, varlen documents, a BlockMask family, a dense mask, score_mod. harness.c
 * builds `llmkern check` and `llmkern bench` on it; tests/test_attention.c calls it. */
#ifndef LLMKERN_ATTENTION_CHECK_H
#define LLMKERN_ATTENTION_CHECK_H

#include "ops/harness.h"
#include "ops/attention/reference.h"

typedef enum {
    LK_AM_NONE, LK_AM_CAUSAL, LK_AM_SLIDING, LK_AM_PREFIX, LK_AM_DOCUMENT,  /* the shape codes 0..4 */
    LK_AM_DOC_IDS,      /* per-batch document ids, bidirectional inside a document */
    LK_AM_AND,          /* documents (bidirectional) AND causal */
    LK_AM_OR,           /* sliding window OR per-batch documents */
    LK_AM_PER_HEAD,     /* causal with a window that grows with the head: H = H_q */
    LK_AM_FULL,         /* everything visible: flex's "no mask" */
    LK_AM_COUNT
} lk_attn_mask_family;

typedef struct {
    int64_t B, Hq, Hkv, Sq, Skv, D;     /* Hkv 0 = Hq; Skv 0 = Sq */
    int causal;
    int64_t window_left, window_right;
    float scale, softcap;
    int sinks;              /* s_aux random per head, and ds_aux checked */
    int n_docs;             /* > 0: varlen, that many documents of random lengths (B = 1);
                             * -1: varlen with lengths in [S/16, S/4] (the bench's documents);
                             * with a family: the document count of its mask, no varlen */
    int family;             /* lk_attn_mask_family: a BlockMask for flex (and eager) */
    int64_t block;          /* BlockMask block size, 0 = 128 */
    int dense;              /* eager: 1 bool mask, 2 additive f32 mask */
    int score_mod;          /* 1 softcap 2.0, 2 ALiBi */
    int deterministic;      /* args.deterministic: a GPU row's ordered backward */
    int views;              /* q, k, v, dq, dk, dv as strided views of token-major rows with a gap
                             * (tests/cuda/test_attention.c lays them out; check refuses it) */
} lk_attention_case;

typedef struct {
    double out, lse, dq, dk, dv, ds_aux;
} lk_attention_errors;

/* Runs impl forward and backward on fresh random inputs (outputs poisoned first) and
 * compares with the reference on the same dtype-rounded inputs. row->pass = worst
 * error <= tol. Returns the facade's status when a pass fails. */
lk_status lk_attention_check_case(const lk_impl *impl, lk_dtype dt, const lk_attention_case *c, uint64_t seed,
                                  lk_check_row *row, lk_attention_errors *err);

/* The BlockMask of a family for case c (documents drawn from seed) in m[0]; m[1], m[2]
 * hold the parts an AND/OR borrows. The caller frees all three (lk_block_mask_free). */
lk_status lk_attention_case_mask(const lk_attention_case *c, uint64_t seed, lk_block_mask m[3]);
/* cu[0..n] for documents of random lengths over S: n_docs of them, or (n_docs 0)
 * lengths in [S/16, S/4] until S is covered. Returns the count (<= cap). */
int64_t lk_attention_doc_cuts(int64_t S, int64_t n_docs, uint64_t seed, int32_t *cu, int64_t cap);

/* Everything one case runs on; ref_in (q, k, v, dout, sinks as double) only when
 * made with_ref. */
typedef struct {
    void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
    float *sink, *dsink, *lse, *dmask;
    int32_t *cu;
    int64_t nq, nk, nlse;
    lk_block_mask bm[3];
    double *ref_in[5];
    lk_attention_args a;
    lk_attn_ref ref;
} lk_attention_problem;

/* Builds the problem of case c for impl (random inputs from seed). Free it with
 * lk_attention_problem_free, also after an error. */
lk_status lk_attention_problem_make(const lk_impl *impl, lk_dtype dt, const lk_attention_case *c, uint64_t seed,
                                    int with_ref, lk_attention_problem *pb);
void lk_attention_problem_free(lk_attention_problem *pb);

double lk_attention_tol(const lk_impl *impl, lk_dtype dt);
/* The LSE's error: the same −inf rows (rows that see no key), and |got − ref| /
 * max(1, max|ref|) elsewhere; NaN or a mismatched −inf is infinite. */
double lk_attention_lse_err(const float *got, const double *ref, int64_t n);

#endif
