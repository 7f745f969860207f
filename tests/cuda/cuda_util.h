/* cuda_util.h — what the GPU tests share: a GPU-or-skip check (a test binary that finds
 * no GPU prints why and returns 77, which ctest reports as skipped), device buffers
 * freed at the end of each test, uploads that round to the storage dtype (so the float64
 * reference sees exactly the values the GPU sees), NaN poison, and the error measure
 * max|out − ref| / max|ref| (NaN or an unwritten element counts as infinite). */
#ifndef LLMKERN_TESTS_CUDA_UTIL_H
#define LLMKERN_TESTS_CUDA_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "llmkern/llmkern.h"

#define LKT_SKIP 77

/* 1 when lk_init found a GPU; otherwise prints the reason and returns 0. Every program's
 * main calls it first, so it also applies LK_TEST_FILTER (cmocka's name pattern, e.g.
 * LK_TEST_FILTER="fa3_*"): a device call that changed one kernel runs only its tests. */
int lkt_have_gpu(const char *test);

/* Device memory, freed by lkt_free_all (call it at the end of each test). */
void *lkt_dev(size_t bytes);
void lkt_free_all(void);
/* x[0..n) rounded to dt in place, then uploaded into new device memory. */
void *lkt_upload(double *x, int64_t n, lk_dtype dt);
/* Overwrites a device buffer with NaN bytes (0xff), which no kernel writes by chance. */
void lkt_poison(void *dev, size_t bytes);
/* n elements of dt from the device, as doubles. Synchronizes and checks for an error. */
void lkt_download(const void *dev, int64_t n, lk_dtype dt, double *out);
double lkt_rel_err(const double *out, const double *ref, int64_t n);
/* n values ~ N(0, scale²) (Box-Muller on a xorshift state). */
void lkt_randn(double *x, int64_t n, uint32_t *seed, double scale);
/* A contiguous view of device memory. */
lk_tensor lkt_view(void *dev, lk_dtype dt, int ndim, const int64_t *shape);
double *lkt_alloc(int64_t n);   /* host doubles, zeroed; freed by lkt_free_all */
/* An op's forward (backward 0) or backward (1), for lkt_capture. */
typedef lk_status (*lkt_pass)(void *user, int backward);
/* The forward then the backward captured on stream s in global mode (any host sync or
 * read fails the capture), both calls and the capture asserted to succeed, instantiated;
 * the caller launches and destroys the returned exec. */
cudaGraphExec_t lkt_capture(cudaStream_t s, lkt_pass pass, void *user);

#endif
