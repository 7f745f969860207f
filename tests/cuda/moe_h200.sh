#!/usr/bin/env bash
# moe_h200.sh — the MoE experts on the H200 in one device call: builds what the MoE GPU
# tests and the bench need (the library, cuda_test_moe_*, the CLI, the bench's shim),
# prints the Hopper grouped GEMMs' registers and spills (ptxas -v of grouped_sm90.cu and
# grouped_wgrad_sm90.cu, sm_90a), runs ctest -R cuda_test_moe (the experts against the float64 reference on the
# wgmma kernel, on mma.sync with lk_moe_cuda_gg_sm80_only, on CUDA cores, the fused_sm90
# row by name; the routers; the dispatch), then bench/peers_cuda.py's moe_rows (the
# grouped GEMMs by kernel name beside torch._grouped_mm, the layer beside torch's
# pipeline and the HF loop). Logs and the bench's table land in $OUT.
#   run: bash tests/cuda/moe_h200.sh            (carry: [".carry"]; tests/cuda/carry.sh fills it)
# The bench runs once per schedule of grouped_sm90.cu / grouped_wgrad_sm90.cu (MOE_SCHEDULES,
# default "coop pingpong pingpong_v4": LLMKERN_GG_SM90 for each run), tables in $OUT/<schedule>/.
# MOE_TEST_S bounds each test binary (ctest --timeout, default 400 s), MOE_BENCH_S each bench run.
# MOE_TESTS=0 skips the tests, MOE_BENCH=0 the bench (to split it over two calls while the
# machine stays warm: the build directory, outside the repository, survives); MOE_NCU=1 adds
# an Nsight Compute profile of the grouped GEMM kernels (bench/peers_cuda.py's moe part).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-$(cd .. && pwd)/build-moe}
exec > >(tee "$OUT/moe_h200.log") 2>&1
export PYTHONUNBUFFERED=1
source tests/cuda/h200_env.sh
t0=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
TESTS=$(ls tests/cuda/test_moe_*.c | sed 's|.*/test_|cuda_test_|; s|\.c$||')
h200_build "$BUILD" $TESTS llmkern_cli llmkern_peers_shim || exit 1
grep "llmkern:" "$OUT/cmake.log"
echo "== built in $(( $(date +%s) - t0 )) s"
# registers and spills of the Hopper kernels (sm_90a alone), beside the tests
NVCC=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
( for f in grouped_sm90 grouped_wgrad_sm90; do
    "${NVCC:-nvcc}" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -Isrc -Iinclude \
      -DLLMKERN_HAVE_CUDA -c src/ops/moe/$f.cu -o /tmp/$f.o 2>&1
  done | grep -E "Compiling entry|spill|Used|error" | sed 's/ptxas info    : //' >"$OUT/ptxas_sm90.log" ) &
PTXAS=$!
"$BUILD/llmkern" list | grep -E "^GPU|moe_experts|fused" | head -12
rc=0
if [ "${MOE_TESTS:-1}" = 1 ]; then
  echo "== tests"
  ctest --test-dir "$BUILD" -R cuda_test_moe -V -j 1 --timeout ${MOE_TEST_S:-400} >"$OUT/ctest.log" 2>&1 || rc=1
  grep -E "tests passed|Passed|\*\*\*Failed|Failed|Timeout" "$OUT/ctest.log" | head -20
  grep -E "\[ *(OK|FAILED|PASSED|  ERROR) |grouped GEMMs on|schedule|not run here|graph|forward:|backward:|tol|LINE" \
    "$OUT/ctest.log" | grep -v "^[0-9]*: *$" | head -170
fi
wait $PTXAS
echo "== ptxas (grouped_sm90.cu, grouped_wgrad_sm90.cu, sm_90a)"; cat "$OUT/ptxas_sm90.log"
if [ "${MOE_BENCH:-1}" = 1 ]; then
  liger=${LK_MOE_LIGER:-1}   # Liger's fused MoE (minutes of autotune) in the first run at most
  for sched in ${MOE_SCHEDULES:-coop pingpong pingpong_v4}; do   # grouped_sm90.cu's schedules, one bench run each
    echo "== bench (moe_rows, LLMKERN_GG_SM90=$sched)"
    mkdir -p "$OUT/$sched"
    LK_MOE_LIGER=$liger LLMKERN_GG_SM90=$sched LK_BENCH_ONLY=moe_rows timeout ${MOE_BENCH_S:-300} python3 bench/peers_cuda.py \
      --build "$BUILD" --out "$OUT/$sched" 2>&1 | grep -v "^W[0-9]" | tee "$OUT/bench_moe_$sched.log" | tail -24
    liger=0
  done
  echo "== the grouped GEMMs and the layer, by schedule"
  for sched in ${MOE_SCHEDULES:-coop pingpong pingpong_v4}; do
    grep -E "^moe (gemm|layer)|check |WARNING|Error" "$OUT/bench_moe_$sched.log" | sed "s/^/$sched: /"
  done
fi
if [ "${MOE_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  LK_BENCH_ONLY=moe_rows timeout ${MOE_NCU_S:-200} ncu --clock-control none --kernel-name regex:"gg_sm90|gg_mma" \
    --launch-count 5 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    python3 bench/peers_cuda.py --build "$BUILD" --out "$OUT/ncu" >"$OUT/ncu.log" 2>&1
  grep -E "gg_(sm90|mma)|Duration|Throughput|Registers|Achieved Occ|Stall|Issued" "$OUT/ncu.log" | head -60
fi
echo "== tests rc $rc, done at $(( $(date +%s) - t0 )) s"
exit $rc
