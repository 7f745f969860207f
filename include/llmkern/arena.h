/* arena.h — the workspace arena: one growable block handed out in aligned pieces and
 * released all at once. An op's facade reserves what the op's query says it needs
 * (the only allocation, on the first step) and the kernels carve from it.
 *
 * A device arena (device = LK_DEVICE_CUDA, set before the first reserve) holds GPU
 * memory from cudaMalloc: the same calls, pointers only the kernels dereference.
 * Growing it frees the old block, which waits for work queued on it; reserve before
 * the first step, as on the CPU. Without CUDA in the build, reserving one fails with
 * LK_EUNAVAILABLE.
 *
 * A caller that owns the memory of its process (a framework with a caching allocator:
 * PyTorch, through python/llmkern) sets arena->allocator: the block then comes from its
 * alloc and goes back through its free, on either device, and the library allocates no
 * memory of its own for workspace. */
#ifndef LLMKERN_ARENA_H
#define LLMKERN_ARENA_H

#include <stddef.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where an arena's block comes from, when not malloc / cudaMalloc. alloc gets the bytes
 * and the arena's device (lk_device_type) and returns memory of that device, aligned to
 * LK_ARENA_ALIGN, or NULL when it cannot (the reserve then fails with LK_ENOMEM); free
 * gets back exactly what alloc returned. On CUDA, free may be called while kernels that
 * use the block are still queued (stream-ordered allocators such as PyTorch's keep it
 * until they finish). The allocator is borrowed: it must outlive the arena's block. */
typedef struct lk_allocator {
    void *(*alloc)(void *user, size_t bytes, int device);
    void (*free)(void *user, void *ptr, int device);
    void *user;
} lk_allocator;

typedef struct {
    unsigned char *base;
    size_t cap;    /* bytes owned */
    size_t used;   /* bytes handed out since the last reset */
    size_t peak;   /* most bytes ever handed out at once: what bench reports */
    int device;    /* lk_device_type of the memory: 0 (LK_DEVICE_CPU) or LK_DEVICE_CUDA */
    const lk_allocator *allocator;   /* NULL: malloc / cudaMalloc; set before the first reserve */
} lk_arena;

#define LK_ARENA_ALIGN 64   /* also keeps 16-byte vector loads aligned on the GPU */

/* The bytes lk_arena_alloc takes for a piece of `bytes`: rounded up to LK_ARENA_ALIGN. A
 * workspace query sums these over the pieces its pass will take. */
static inline size_t lk_arena_piece(size_t bytes) {
    return (bytes + LK_ARENA_ALIGN - 1) & ~(size_t)(LK_ARENA_ALIGN - 1);
}

/* Makes sure `bytes` more can be handed out after the current `used`; grows only when
 * needed, and only while nothing is handed out (growing moves the block). */
LK_API lk_status lk_arena_reserve(lk_arena *a, size_t bytes);
/* A 64-byte aligned piece, or NULL when the reservation was too small. Zero bytes give
 * a valid pointer that must not be dereferenced, never NULL. */
LK_API void *lk_arena_alloc(lk_arena *a, size_t bytes);
/* Everything handed out since `mark` (a value of a->used) is given back. */
LK_API void lk_arena_release(lk_arena *a, size_t mark);
/* Gives the block back (to the allocator when there is one) and zeroes the counters;
 * device and allocator stay, so the arena can be used again. */
LK_API void lk_arena_free(lk_arena *a);

#ifdef __cplusplus
}
#endif
#endif
