#!/usr/bin/env bash
# run_prebuilt.sh — the H200 side of tests/cuda/prebuild.sh: no build, only runs. Unpacks
# .prebuilt/ (prebuilt_env.sh), runs the named cuda_test_* binaries (default: every one packed)
# one by one under TEST_S seconds each (default 300), with torch's cuDNN first on the library
# path so the cudnn cases run, then, when BENCH names a part of bench/peers_cuda.py
# (LK_BENCH_ONLY: moe_rows, attention_rows, ...), that bench. Logs and tables land in $OUT.
#   device: bash tests/cuda/run_prebuilt.sh [cuda_test_x ...]    (carry: [".carry", ".prebuilt"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run_prebuilt.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source tests/cuda/h200_env.sh >/dev/null
source tests/cuda/prebuilt_env.sh
t0=$(date +%s)
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=($(cd "$B" && ls cuda_test_* 2>/dev/null))
rc=0
for t in "${TESTS[@]}"; do
  s=$(date +%s)
  LD_LIBRARY_PATH=${LK_TORCH_CUDNN:+$LK_TORCH_CUDNN:}$LD_LIBRARY_PATH timeout "${TEST_S:-300}" "$B/$t" >"$OUT/$t.log" 2>&1
  r=$?
  [ $r = 0 ] || [ $r = 77 ] || rc=1   # 77: skipped (no GPU of the kind the test needs)
  echo "$t: rc $r in $(( $(date +%s) - s )) s"
  grep -E "^\[ *(FAILED|  ERROR) |^HANG" "$OUT/$t.log" | head -8
done
if [ -n "${BENCH:-}" ]; then
  LK_BENCH_ONLY=$BENCH python3 bench/peers_cuda.py --build "$B" --out "$OUT" 2>&1 | grep -v "^W[0-9]" | tail -40
fi
echo "== tests rc $rc, done at $(( $(date +%s) - t0 )) s"
exit $rc
