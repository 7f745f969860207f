/* status.h — every public llmkern function returns an lk_status; on failure the
 * thread-local lk_last_error() names the op, the argument, and expected vs got. */
#ifndef LLMKERN_STATUS_H
#define LLMKERN_STATUS_H

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LK_OK = 0,
    LK_EINVAL,        /* a bad argument or option value */
    LK_ESHAPE,        /* shapes disagree */
    LK_EDTYPE,        /* a dtype the op or implementation does not take */
    LK_EUNAVAILABLE,  /* known, but not available in this build or on this machine */
    LK_ENOMEM,
    LK_EIO,           /* a file could not be read, written or parsed */
    LK_EDEVICE,
    LK_ECOMM,
    LK_EINTERNAL
} lk_status;

/* The text of the last error on this thread ("" after success-only calls). */
LK_API const char *lk_last_error(void);

/* The status as a word: "LK_ESHAPE". */
LK_API const char *lk_status_name(lk_status s);

/* Records a formatted message as this thread's last error and returns s.
 * For implementations and extensions: `return lk_error(LK_ESHAPE, "...");` */
LK_API lk_status lk_error(lk_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

LK_API void lk_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
