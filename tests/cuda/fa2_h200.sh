#!/usr/bin/env bash
# fa2_h200.sh — flash_attention_2's tensor-core kernel (src/ops/attention/fa2.cu) on the
# H200 in one call that fits five minutes: builds only the attention GPU test and the
# bench's shim, runs cuda_test_attention (its case lines kept), then the attention part
# of bench/peers_cuda.py for flash_attention_2 beside SDPA's flash and cuDNN backends.
# FA2_NCU=1 adds an Nsight Compute profile of one forward and one dk/dv launch
# (bench/fa2_once.py). Logs land in $OUT.
#   run: bash tests/cuda/fa2_h200.sh            (carry: [".carry"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-h200}
exec > >(tee "$OUT/fa2_h200.log") 2>&1
source tests/cuda/h200_env.sh
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLMKERN_CUDA=ON "${CARRIED[@]}" >"$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target cuda_test_attention llmkern_peers_shim >"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
echo "== tests"
timeout ${FA2_TEST_S:-110} "$BUILD/cuda_test_attention" >"$OUT/cuda_test_attention.log" 2>&1
rc=$?
grep -E "^\[ *(OK|FAILED|PASSED|  ERROR) |flash_attention_2|sdpa |deterministic|error|assert" \
  "$OUT/cuda_test_attention.log" | grep -v "cudnn\|flash_attention_3" | head -80
echo "== tests rc $rc at $(( $(date +%s) - t0 )) s"
echo "== bench"
PYTHONUNBUFFERED=1 LK_BENCH_ONLY=attention_rows LK_ATT_IMPLS=${LK_ATT_IMPLS:-flash_attention_2} \
  timeout ${FA2_BENCH_S:-100} python3 bench/peers_cuda.py --build "$BUILD" --out "$OUT" 2>&1 | grep -v "^W[0-9]"
if [ "${FA2_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then   # one launch of each kernel
  timeout ${FA2_NCU_S:-60} ncu --clock-control none --kernel-name regex:"fa2_(fwd|dkv)" --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    python3 bench/fa2_once.py --build "$BUILD" >"$OUT/ncu.log" 2>&1
  grep -E "fa2_|Duration|Throughput|Registers|Achieved Occ|Theoretical Occ|Stall|Warp Cycles|Issued|Shared Memory Config" \
    "$OUT/ncu.log" | head -60
fi
echo "== done at $(( $(date +%s) - t0 )) s"
exit $rc
