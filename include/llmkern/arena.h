/* arena.h — the workspace arena: one growable block handed out in aligned pieces and
 * released all at once. An op's facade reserves what the op's query says it needs
 * (the only allocation, on the first step) and the kernels carve from it. */
#ifndef LLMKERN_ARENA_H
#define LLMKERN_ARENA_H

#include <stddef.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    unsigned char *base;
    size_t cap;    /* bytes owned */
    size_t used;   /* bytes handed out since the last reset */
    size_t peak;   /* most bytes ever handed out at once: what bench reports */
} lk_arena;

#define LK_ARENA_ALIGN 64

/* Makes sure `bytes` more can be handed out after the current `used`; grows only when
 * needed, and only while nothing is handed out (growing moves the block). */
lk_status lk_arena_reserve(lk_arena *a, size_t bytes);
/* A 64-byte aligned piece, or NULL when the reservation was too small. Zero bytes give
 * a valid pointer that must not be dereferenced, never NULL. */
void *lk_arena_alloc(lk_arena *a, size_t bytes);
/* Everything handed out since `mark` (a value of a->used) is given back. */
void lk_arena_release(lk_arena *a, size_t mark);
void lk_arena_free(lk_arena *a);

#ifdef __cplusplus
}
#endif
#endif
