/* watchdog.h — internal to src/dist: comm.c's wrappers mark each blocking call in flight
 * (watchdog.c, the collective watchdog of comm.h). */
#ifndef LLMKERN_DIST_WATCHDOG_H
#define LLMKERN_DIST_WATCHDOG_H

#include "llmkern/comm.h"

#pragma GCC visibility push(hidden)
/* Marks c's call `what` in flight; returns the token lk_watch_end takes (0: not watched:
 * disarmed, or a group of one). */
int lk_watch_begin(const lk_comm *c, const char *what);
void lk_watch_end(int token);
#pragma GCC visibility pop

#endif
