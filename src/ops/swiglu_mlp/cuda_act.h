/* cuda_act.h — the SwiGLU activation on CUDA, h = silu(clamp(gate)) · clamp(up), and its
 * backward, as C launchers on raw device pointers: row-major [rows, cols] operands, each
 * with its own leading dimension (in elements), so gate and up may be the two halves of
 * the fused gate_up tensor ([rows, 2I], ld 2I) or two tensors of their own. f32 math,
 * storage dtype dt (f32 or bf16) for every operand. limit = swiglu_limit (0 = off).
 *
 * Implemented by fused.cu; used by the CUDA SwiGLU MLP (fused_cuda.c) and, for the
 * activation alone, by the bench shim (bench/peers_shim.c, a module of its own: hence
 * LK_INTERNAL_API, exported from libllmkern.so). Queued on stream (a cudaStream_t, NULL =
 * default); LK_EDEVICE with the runtime's message when the launch fails. The backward's
 * outputs may be its inputs exactly (each element is read before it is written, by one
 * thread). */
#ifndef LLMKERN_SWIGLU_CUDA_ACT_H
#define LLMKERN_SWIGLU_CUDA_ACT_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

LK_INTERNAL_API lk_status lk_cuda_swiglu_act_forward(lk_dtype dt, int64_t rows, int64_t cols, float limit,
                                     const void *gate, int64_t ld_gate, const void *up, int64_t ld_up,
                                     void *h, int64_t ld_h, void *stream);

/* dgate, dup from dh and the pre-activations; h (the forward's output, for the down
 * projection's weight gradient) too when h is not NULL. */
LK_INTERNAL_API lk_status lk_cuda_swiglu_act_backward(lk_dtype dt, int64_t rows, int64_t cols, float limit,
                                      const void *dh, int64_t ld_dh, const void *gate, int64_t ld_gate,
                                      const void *up, int64_t ld_up, void *dgate, int64_t ld_dgate,
                                      void *dup, int64_t ld_dup, void *h, int64_t ld_h, void *stream);

#ifdef __cplusplus
}
#endif
#endif
