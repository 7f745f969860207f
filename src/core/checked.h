/* checked.h — sizes computed from user input, checked before anything is allocated or
 * indexed with them. Every path that sizes a buffer from a config value, a command-line
 * argument, a file's header or a caller's shape goes through these (issue 20: a step
 * count that wrapped `steps * 5` to 4 elements, a BlockMask whose B*H*nq*nk wrapped to
 * 64 bytes). Each returns LK_OK or LK_EINVAL with a message that starts with what
 * (the op and the argument, e.g. "train: train.steps") and gives the factors:
 *   "train: train.steps: 3689348814741910324 x 5 x 4 bytes does not fit in 64 bits". */
#ifndef LLMKERN_CORE_CHECKED_H
#define LLMKERN_CORE_CHECKED_H

#include <stddef.h>
#include <stdint.h>
#include "llmkern/status.h"

/* *out = a * b, for a, b >= 0 and a product <= INT64_MAX; *out is untouched on error. */
lk_status lk_checked_mul(const char *what, int64_t a, int64_t b, int64_t *out);
/* *out = a + b, for a, b >= 0 and a sum <= INT64_MAX. */
lk_status lk_checked_add(const char *what, int64_t a, int64_t b, int64_t *out);
/* *out = the product of the n factors (each >= 0), the error listing them all. */
lk_status lk_checked_prod(const char *what, const int64_t *factors, int n, int64_t *out);
/* *out = count * elem bytes as a size_t that one allocation may hold (<= PTRDIFF_MAX);
 * the error names what, count and elem. */
lk_status lk_checked_bytes(const char *what, int64_t count, size_t elem, size_t *out);
/* LK_ENOMEM, naming what and both sizes, when bytes exceed this machine's physical
 * memory (lk_hw.cpu_mem_bytes; no limit when it could not be read): what cannot fit is
 * refused before it is allocated, not left to the OOM killer. */
lk_status lk_check_fits_memory(const char *what, uint64_t bytes);
/* "1.5 GiB", "320 B": bytes for a message, into buf. */
const char *lk_bytes_str(uint64_t bytes, char *buf, size_t n);

#endif
