/* st_dtype.h — the safetensors dtype table shared by the reader and the writer
 * (internal). rank is the dtype's place in the reference implementation's Dtype enum:
 * the writer orders tensors by descending rank, as that library does. */
#ifndef LLMKERN_MODEL_ST_DTYPE_H
#define LLMKERN_MODEL_ST_DTYPE_H

#include <stddef.h>
#include "llmkern/tensor.h"

typedef struct {
    const char *name;   /* "BF16" */
    size_t size;        /* bytes per element */
    lk_dtype dtype;     /* LK_DTYPE_COUNT when llmkern has no such type */
    int rank;
} lk_st_dtype_info;

/* The entry named name, or NULL. */
const lk_st_dtype_info *lk_st_dtype_lookup(const char *name);
/* The entry of an llmkern dtype (never NULL for a valid dtype). */
const lk_st_dtype_info *lk_st_dtype_of(lk_dtype dt);

#endif
