/* arena.c — the workspace arena (see arena.h): host memory, or device memory from
 * cudaMalloc when arena->device is LK_DEVICE_CUDA (built with CUDA only), or either from
 * the caller's allocator when arena->allocator is set. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/arena.h"
#include "llmkern/tensor.h"
#ifdef LLMKERN_HAVE_CUDA
#include "core/cuda_check.h"
#endif

/* The block for a device arena; the host path stays posix_memalign. */
static lk_status device_alloc(void **p, size_t bytes) {
#ifdef LLMKERN_HAVE_CUDA
    cudaError_t e = cudaMalloc(p, bytes);     /* 256-byte aligned, more than LK_ARENA_ALIGN */
    if (e != cudaSuccess) {
        cudaGetLastError();                    /* an allocation failure is not sticky: clear it */
        return lk_error(e == cudaErrorMemoryAllocation ? LK_ENOMEM : LK_EDEVICE,
                        "arena: cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return LK_OK;
#else
    (void)p;
    return lk_error(LK_EUNAVAILABLE, "arena: a CUDA arena of %zu bytes: built without CUDA", bytes);
#endif
}

static void block_free(lk_arena *a) {
    if (a->allocator) {
        if (a->base) a->allocator->free(a->allocator->user, a->base, a->device);
        return;
    }
#ifdef LLMKERN_HAVE_CUDA
    if (a->device == LK_DEVICE_CUDA) {
        if (a->base) cudaFree(a->base);
        return;
    }
#endif
    free(a->base);
}

lk_status lk_arena_reserve(lk_arena *a, size_t bytes) {
    size_t need = a->used + lk_arena_piece(bytes);
    if (need <= a->cap) return LK_OK;
    if (a->used != 0)
        return lk_error(LK_ENOMEM, "arena: cannot grow to %zu bytes while %zu are handed out "
                        "(reserve before the first allocation)", need, a->used);
    void *p = NULL;
    if (a->allocator) {
        if (a->allocator->alloc == NULL || a->allocator->free == NULL)
            return lk_error(LK_EINVAL, "arena: allocator: expected alloc and free, got %s NULL",
                            a->allocator->alloc == NULL ? "alloc" : "free");
        p = a->allocator->alloc(a->allocator->user, need, a->device);
        if (p == NULL)
            return lk_error(LK_ENOMEM, "arena: the caller's allocator returned NULL for %zu bytes", need);
        if ((uintptr_t)p % LK_ARENA_ALIGN != 0) {
            a->allocator->free(a->allocator->user, p, a->device);
            return lk_error(LK_EINVAL, "arena: the caller's allocator: expected %d-byte aligned memory, got %p",
                            LK_ARENA_ALIGN, p);
        }
    } else if (a->device == LK_DEVICE_CUDA) {
        lk_status s = device_alloc(&p, need);
        if (s) return s;
    } else if (posix_memalign(&p, LK_ARENA_ALIGN, need) != 0) {
        return lk_error(LK_ENOMEM, "arena: out of memory reserving %zu bytes", need);
    }
    block_free(a);
    a->base = p;
    a->cap = need;
    return LK_OK;
}

void *lk_arena_alloc(lk_arena *a, size_t bytes) {
    static unsigned char nothing[LK_ARENA_ALIGN] __attribute__((aligned(LK_ARENA_ALIGN)));
    if (bytes == 0) return a->base ? a->base + a->used : nothing;   /* empty, but not "no room" */
    size_t n = lk_arena_piece(bytes);
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
    int device = a->device;
    const lk_allocator *allocator = a->allocator;
    block_free(a);
    memset(a, 0, sizeof *a);
    a->device = device;
    a->allocator = allocator;
}
