/* validate.h — the argument checks op facades share (src/ops/<op>/<op>.c; nothing else
 * includes this). Each returns LK_OK or sets an error that names the op, the argument,
 * and expected vs got, e.g. "rms_norm: weight: expected shape [4096], got [4095]". The
 * implementation a facade is called with is checked by lk_impl_check (src/ops/op_def.h),
 * its op's descriptor saying which vtable members it needs. */
#ifndef LLMKERN_VALIDATE_H
#define LLMKERN_VALIDATE_H

#include "llmkern/llmkern.h"
#include "ops/op_def.h"
#include "ops/rows.h"

/* t.data is set. */
lk_status lk_expect_present(const char *op, const char *arg, const lk_tensor *t);
/* t.dtype is one of the LK_DTYPE_BIT mask. */
lk_status lk_expect_dtype(const char *op, const char *arg, const lk_tensor *t, unsigned dtypes);
/* t.dtype == want. */
lk_status lk_expect_dtype_eq(const char *op, const char *arg, const lk_tensor *t, lk_dtype want);
/* t is contiguous, row-major, ndim >= min_ndim. */
lk_status lk_expect_contiguous(const char *op, const char *arg, const lk_tensor *t, int min_ndim);
/* t has exactly this shape. */
lk_status lk_expect_shape(const char *op, const char *arg, const lk_tensor *t, int ndim,
                          const int64_t *shape);
/* t has the shape of like (and the same dtype). */
lk_status lk_expect_like(const char *op, const char *arg, const lk_tensor *t, const lk_tensor *like);
/* t lives on the device of ctx. */
lk_status lk_expect_device(const char *op, const char *arg, const lk_tensor *t, lk_device_type dev);
/* Where every tensor argument's checks begin, in this order: data present (unless
 * need_data is 0: a size query), on dev, contiguous with at least min_ndim dims. */
lk_status lk_expect_operand(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                            int min_ndim);
/* present, on dev, contiguous, of exactly this shape and one of the dtypes: the checks
 * most tensor arguments take, in this order. */
lk_status lk_expect_tensor(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int ndim,
                           const int64_t *shape, unsigned dtypes);
/* The caller's saved storage holds the `need` bytes the op's size query (named by query,
 * e.g. "lk_rms_norm_saved_bytes") asked for; nothing is needed when need is 0. */
lk_status lk_expect_saved(const char *op, const char *query, const lk_saved *saved, size_t need);
/* The call's args and ctx are given, and ctx is on impl's device. */
lk_status lk_expect_call(const char *op, const lk_impl *impl, const void *args, const lk_ctx *ctx);

/* A tensor the others of a call are shaped and typed like (rms_norm's y, rope's q_out):
 * present, on dev, contiguous with at least min_ndim dims, of like's shape and dtype. */
lk_status lk_expect_tensor_like(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t,
                                const lk_tensor *like, int min_ndim);
/* The tensor of rows whose last dim the op works along (x of rms_norm, linear and
 * swiglu_mlp, hidden of cross_entropy): data present unless need_data is 0 (a size
 * query), on dev, contiguous with at least min_ndim dims, one of dtypes, and a last dim
 * >= 1; *len is that dim and *rows the product of the others (0 rows are valid). */
lk_status lk_expect_rows(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                         int min_ndim, unsigned dtypes, int64_t *rows, int64_t *len);
/* lk_expect_operand for a tensor of rows that may be a strided view (rows.h): present
 * unless need_data is 0, on dev, at least min_ndim dims, its last dim contiguous and its
 * leading dims folding into at most two levels that keep every row apart from the
 * others; *m says where the rows lie. */
lk_status lk_expect_row_view(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                             int min_ndim, lk_rows *m);

/* lk_expect_operand for a tensor that may be a strided view in any order of its dims
 * (attention's q, k, v and their gradients): present unless need_data is 0, on dev, at
 * least min_ndim dims, its last dim contiguous and its elements apart (each stride at
 * least the extent of the dims of smaller strides: no two elements share an address). */
lk_status lk_expect_view(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                         int min_ndim);

/* The end of a pass run in the workspace lk_ctx_workspace_begin reserved for it: gives
 * the workspace back and returns the pass's own status, so a facade's pass reads
 *     if ((s = lk_ctx_workspace_begin(ctx, OP, bytes, &mark))) return s;
 *     return lk_workspace_done(ctx, mark, vt->forward(a, ctx));   */
lk_status lk_workspace_done(lk_ctx *ctx, size_t mark, lk_status pass);

/* A piece of memory an op reads or writes; p NULL or bytes 0 = absent. */
typedef struct {
    const char *name;
    const void *p;
    size_t bytes;
} lk_region;

/* t's bytes as a region named name (absent when t has no data); a view's, from data to
 * its last element (lk_tensor_span_bytes). */
lk_region lk_tensor_region(const char *name, const lk_tensor *t);
/* The region of the tensor member of a call's args (a pointer), named as the member:
 * LK_ARG_REGION(a, dx) is lk_tensor_region("dx", &a->dx). */
#define LK_ARG_REGION(args, member) lk_tensor_region(#member, &(args)->member)
/* The region of what the call's forward saves (args->saved), named "saved". */
#define LK_SAVED_REGION(args) ((lk_region){"saved", (args)->saved.data, (args)->saved.bytes})

/* Every output apart from every other output and every input; the error names the
 * output and what it overlaps. An op that allows one exact alias (dx over dy) leaves
 * that pair out. */
lk_status lk_expect_apart(const char *op, const lk_region *outs, int n_outs, const lk_region *ins, int n_ins);

#endif
