/* cublaslt.cu — the kernel of linear `cublaslt` beside its cuBLASLt GEMMs (cublaslt_cuda.c):
 * dst[c] += Σ_r src[r, c], the bias gradient (cuda_colsum.h). A block owns 32 columns:
 * its 8 warps take every 8th row (a warp reads 32 neighbouring columns of one row), and
 * the 8 partial sums are added in warp order, so the result does not depend on timing. */
#include "ops/cuda_util.cuh"
#include "core/cuda_check.h"
#include "ops/linear/cuda_colsum.h"

#define COLS 32
#define ROWS_PER_PASS 8

template <typename S, typename D>
__global__ void __launch_bounds__(COLS * ROWS_PER_PASS) colsum_acc(const S *__restrict__ src, int64_t rows,
                                                                  int64_t cols, D *__restrict__ dst) {
    __shared__ float part[ROWS_PER_PASS][COLS];
    int64_t c = (int64_t)blockIdx.x * COLS + threadIdx.x;
    float s = 0.0f;
    if (c < cols)
        for (int64_t r = threadIdx.y; r < rows; r += ROWS_PER_PASS) s += lk_to_f32(src[r * cols + c]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = lk_to_f32(dst[c]);
        float add = 0.0f;
#pragma unroll
        for (int i = 0; i < ROWS_PER_PASS; i++) add += part[i][threadIdx.x];
        dst[c] = lk_from_f32<D>(t + add);
    }
}

template <typename S>
static void launch(const S *src, int64_t rows, int64_t cols, lk_dtype dst_dt, void *dst, cudaStream_t st) {
    dim3 block(COLS, ROWS_PER_PASS), grid((unsigned)lk_cdiv(cols, COLS));
    if (dst_dt == LK_F32) colsum_acc<S, float><<<grid, block, 0, st>>>(src, rows, cols, (float *)dst);
    else colsum_acc<S, lk_bf16_t><<<grid, block, 0, st>>>(src, rows, cols, (lk_bf16_t *)dst);
}

extern "C" lk_status lk_cuda_colsum_acc(lk_dtype src_dt, const void *src, int64_t rows, int64_t cols,
                                        lk_dtype dst_dt, void *dst, void *stream) {
    if ((src_dt != LK_F32 && src_dt != LK_BF16) || (dst_dt != LK_F32 && dst_dt != LK_BF16))
        return lk_error(LK_EDTYPE, "colsum: expected f32 or bf16, got %s into %s", lk_dtype_name(src_dt),
                        lk_dtype_name(dst_dt));
    if (cols == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (src_dt == LK_F32) launch((const float *)src, rows, cols, dst_dt, dst, st);
    else launch((const lk_bf16_t *)src, rows, cols, dst_dt, dst, st);
    LK_CUDA_LAUNCHED("linear: bias gradient (column sum)");
    return LK_OK;
}
