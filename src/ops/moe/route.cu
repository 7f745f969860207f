/* route.cu — the MoE experts' routing on the device (moe_cuda.h): per-expert counts, the
 * exclusive scan into offsets and the stable permutation into expert-sorted rows, the
 * same arrays permute.c's counting sort writes on the CPU, with no host read: every
 * buffer is sized by the route bound R = T·k the host knows.
 *
 *   rank     the routes in chunks of CHUNK (a block each): a thread's rank is the number
 *            of earlier routes of its chunk with the same expert (a loop over the chunk's
 *            ids in shared memory, broadcast reads), and the last route of each expert in
 *            the chunk writes the chunk's count cnt[chunk, e] — no atomics, so nothing
 *            depends on the order blocks run in. Bad ids raise *flag and count as 0.
 *   scan     one block: per expert, an exclusive scan of its counts over the chunks (in
 *            place, batches of 8 loads in flight), the block-wide exclusive scan of the
 *            totals into offs[0..E], then offs[e] added to the expert's chunk bases.
 *   scatter  pos[r] = cnt[chunk(r), e] + rank[r]; order[pos[r]] = r.
 *
 * Cost: O(R·CHUNK) shared-memory compares and O(E·R/CHUNK) scan steps; at R 65536 (T 8192,
 * k 8), E 128 the scan walks 64 chunks per expert. Not measured yet. */
#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe/moe_cuda.h"

#define CHUNK 1024   /* routes a rank block takes (its threads) */
#define SCAN_T 1024  /* threads of the one scan block */

static int64_t chunks_of(int64_t routes) { return (routes + CHUNK - 1) / CHUNK; }

extern "C" size_t lk_moe_cuda_route_ws_bytes(int64_t routes, int64_t experts) {
    return lk_arena_piece(sizeof(int32_t) * (size_t)(chunks_of(routes) * experts)) +
           lk_arena_piece(sizeof(int32_t) * (size_t)routes);
}

static __device__ __forceinline__ int32_t checked_id(int32_t id, int32_t E, int *flag) {
    if (id < 0 || id >= E) {
        *flag = 1;   /* every writer stores the same value */
        return 0;
    }
    return id;
}

__global__ void __launch_bounds__(CHUNK) route_rank(const int32_t *ids, int64_t R, int32_t E, int32_t *cnt,
                                                    int32_t *rank, int *flag) {
    __shared__ int32_t s[CHUNK];
    int64_t base = (int64_t)blockIdx.x * CHUNK, r = base + threadIdx.x;
    int32_t id = -1;   /* past the end: matches nothing */
    if (r < R) id = checked_id(ids[r], E, flag);
    s[threadIdx.x] = id;
    __syncthreads();
    if (r >= R) return;
    int n = (int)(R - base < CHUNK ? R - base : CHUNK), me = (int)threadIdx.x, before = 0;
    bool later = false;
    for (int j = 0; j < n; j++) {
        int32_t v = s[j];
        before += v == id && j < me;
        later |= v == id && j > me;
    }
    rank[r] = before;
    if (!later) cnt[(int64_t)blockIdx.x * E + id] = before + 1;
}

/* Exclusive scan of v over the block (blockDim.x a multiple of 32, <= 1024); *total gets
 * the sum. sh: 32 slots of shared memory. Ends with a barrier. */
static __device__ long long block_excl_scan(long long v, long long *sh, long long *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    long long x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        long long s = lane < nw ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            long long y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < nw) sh[lane] = s;
    }
    __syncthreads();
    long long before = warp ? sh[warp - 1] : 0;
    *total = sh[nw - 1];
    __syncthreads();
    return before + x - v;
}

__global__ void __launch_bounds__(SCAN_T) route_scan(int32_t *cnt, int64_t nch, int32_t E, int64_t *offs) {
    __shared__ long long sh[32];
    long long carry = 0;
    for (int32_t e0 = 0; e0 < E; e0 += SCAN_T) {   /* the same trip count on every thread */
        int32_t e = e0 + (int32_t)threadIdx.x;
        long long tot = 0;
        if (e < E)
            for (int64_t c0 = 0; c0 < nch; c0 += 8) {
                int32_t v[8];
#pragma unroll
                for (int q = 0; q < 8; q++) v[q] = c0 + q < nch ? cnt[(c0 + q) * E + e] : 0;
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (c0 + q < nch) {
                        cnt[(c0 + q) * E + e] = (int32_t)tot;
                        tot += v[q];
                    }
            }
        long long all, ex = block_excl_scan(tot, sh, &all), b = carry + ex;
        if (e < E) {
            offs[e] = b;
            for (int64_t c = 0; c < nch; c++) cnt[c * E + e] += (int32_t)b;
        }
        carry += all;
    }
    if (threadIdx.x == 0) offs[E] = carry;
}

__global__ void route_scatter(const int32_t *ids, int64_t R, int32_t E, const int32_t *cnt, const int32_t *rank,
                              int32_t *order, int32_t *pos) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= R) return;
    int32_t id = ids[r];
    if (id < 0 || id >= E) id = 0;
    int32_t p = cnt[(r / CHUNK) * E + id] + rank[r];
    order[p] = (int32_t)r;
    pos[r] = p;
}

__global__ void check_ids(const int32_t *ids, int64_t R, int32_t E, int *flag) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r < R) (void)checked_id(ids[r], E, flag);
}

static unsigned blocks(int64_t n, int t) { return (unsigned)((n + t - 1) / t); }

extern "C" lk_status lk_moe_cuda_route(const int32_t *ids, int64_t R, int64_t E, int64_t *offs, int32_t *order,
                                       int32_t *pos, int *flag, void *ws, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if (R < 1 || R > INT32_MAX || E < 1 || E > INT32_MAX || chunks_of(R) > INT32_MAX)
        return lk_error(LK_EINTERNAL, "moe_experts: fused (cuda): routing of %lld routes over %lld experts: "
                        "expected 1 <= R < 2^31 and E >= 1", (long long)R, (long long)E);
    int64_t nch = chunks_of(R);
    int32_t *cnt = (int32_t *)ws, *rank = (int32_t *)((char *)ws + lk_arena_piece(sizeof(int32_t) * (size_t)(nch * E)));
    LK_CUDA_TRY(cudaMemsetAsync(flag, 0, sizeof(int), st));
    LK_CUDA_TRY(cudaMemsetAsync(cnt, 0, sizeof(int32_t) * (size_t)(nch * E), st));
    route_rank<<<(unsigned)nch, CHUNK, 0, st>>>(ids, R, (int32_t)E, cnt, rank, flag);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda): route_rank");
    route_scan<<<1, SCAN_T, 0, st>>>(cnt, nch, (int32_t)E, offs);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda): route_scan");
    route_scatter<<<blocks(R, 256), 256, 0, st>>>(ids, R, (int32_t)E, cnt, rank, order, pos);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda): route_scatter");
    return LK_OK;
}

extern "C" lk_status lk_moe_cuda_check_ids(const int32_t *ids, int64_t R, int64_t E, int *flag, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    LK_CUDA_TRY(cudaMemsetAsync(flag, 0, sizeof(int), st));
    if (R < 1) return LK_OK;
    check_ids<<<blocks(R, 256), 256, 0, st>>>(ids, R, (int32_t)(E > INT32_MAX ? INT32_MAX : E), flag);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda): check_ids");
    return LK_OK;
}
