/* validate.h — argument checks shared by every op facade. Each returns LK_OK or sets
 * an error that names the op, the argument, and expected vs got, e.g.
 *   "rms_norm: weight: expected shape [4096], got [4095]". */
#ifndef LLMKERN_VALIDATE_H
#define LLMKERN_VALIDATE_H

#include "llmkern/llmkern.h"

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
/* present, on dev, contiguous, of exactly this shape and one of the dtypes: the checks
 * most tensor arguments take, in this order. */
lk_status lk_expect_tensor(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int ndim,
                           const int64_t *shape, unsigned dtypes);
/* The caller's saved storage holds the `need` bytes the op's size query (named by query,
 * e.g. "lk_rms_norm_saved_bytes") asked for; nothing is needed when need is 0. */
lk_status lk_expect_saved(const char *op, const char *query, const lk_saved *saved, size_t need);
/* impl is an implementation of op, with a vtable whose first member, the int version
 * every vtable starts with, is at least 1. The facade checks its own members. */
lk_status lk_expect_impl(const char *op, const lk_impl *impl, lk_op want);
/* After lk_expect_impl: present says whether the vtable has the members every op's
 * vtable needs (saved_bytes, forward, backward), which only the facade can look at. */
lk_status lk_expect_members(const char *op, const lk_impl *impl, int present);
/* The call's args and ctx are given, and ctx is on impl's device. */
lk_status lk_expect_call(const char *op, const lk_impl *impl, const void *args, const lk_ctx *ctx);

/* A piece of memory an op reads or writes; p NULL or bytes 0 = absent. */
typedef struct {
    const char *name;
    const void *p;
    size_t bytes;
} lk_region;

/* t's bytes as a region named name (absent when t has no data). */
lk_region lk_tensor_region(const char *name, const lk_tensor *t);

/* Every output apart from every other output and every input; the error names the
 * output and what it overlaps. An op that allows one exact alias (dx over dy) leaves
 * that pair out. */
lk_status lk_expect_apart(const char *op, const lk_region *outs, int n_outs, const lk_region *ins, int n_ins);

#endif
