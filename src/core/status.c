/* status.c — the thread-local last error. One buffer per thread, so a failing call on
 * one thread never clobbers the message another thread is about to read. */
#include <stdarg.h>
#include <stdio.h>
#include "llmkern/status.h"

static _Thread_local char last_error[1024];

const char *lk_last_error(void) { return last_error; }

void lk_clear_error(void) { last_error[0] = '\0'; }

lk_status lk_error(lk_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *lk_status_name(lk_status s) {
    static const char *const names[] = {
        "LK_OK", "LK_EINVAL", "LK_ESHAPE", "LK_EDTYPE", "LK_EUNAVAILABLE",
        "LK_ENOMEM", "LK_EIO", "LK_EDEVICE", "LK_ECOMM", "LK_EINTERNAL",
    };
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "LK_E?";
}
