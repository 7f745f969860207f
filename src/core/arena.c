/* arena.c — the workspace arena (see arena.h). */
#include <stdlib.h>
#include <string.h>
#include "llmkern/arena.h"

static size_t round_up(size_t n) { return (n + LK_ARENA_ALIGN - 1) & ~(size_t)(LK_ARENA_ALIGN - 1); }

lk_status lk_arena_reserve(lk_arena *a, size_t bytes) {
    size_t need = a->used + round_up(bytes);
    if (need <= a->cap) return LK_OK;
    if (a->used != 0)
        return lk_error(LK_ENOMEM, "arena: cannot grow to %zu bytes while %zu are handed out "
                        "(reserve before the first allocation)", need, a->used);
    void *p = NULL;
    if (posix_memalign(&p, LK_ARENA_ALIGN, need) != 0)
        return lk_error(LK_ENOMEM, "arena: out of memory reserving %zu bytes", need);
    free(a->base);
    a->base = p;
    a->cap = need;
    return LK_OK;
}

void *lk_arena_alloc(lk_arena *a, size_t bytes) {
    static unsigned char nothing[LK_ARENA_ALIGN] __attribute__((aligned(LK_ARENA_ALIGN)));
    if (bytes == 0) return a->base ? a->base + a->used : nothing;   /* empty, but not "no room" */
    size_t n = round_up(bytes);
    if (a->base == NULL || a->used + n > a->cap) return NULL;
    void *p = a->base + a->used;
    a->used += n;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void lk_arena_release(lk_arena *a, size_t mark) {
    if (mark <= a->used) a->used = mark;
}

void lk_arena_free(lk_arena *a) {
    free(a->base);
    memset(a, 0, sizeof *a);
}
