#!/usr/bin/env bash
# attn_h200.sh — the attention rows on the H200 in one call: builds only what attention
# needs (the library, its GPU tests, the CLI and the bench's shim), runs the GPU attention
# tests, `llmkern list` / `explain --device cuda`, then the attention part of
# bench/peers_cuda.py (the rows in LK_ATT_IMPLS, default all, beside SDPA's cuDNN and
# flash backends; LK_ATT_PASSES=fwd for forwards alone). Logs and the bench's table land
# in $OUT. ATT_NCU=1 adds an Nsight Compute profile of one launch of each kernel matching
# ATT_NCU_KERNELS (default the tensor-core forwards and fa2's dk/dv) for the row
# ATT_NCU_IMPL (default flash_attention_3), through bench/attention_once.py.
# cuda_test_attention runs each case under a 60 s hang guard (a "HANG:" line, then the test
# ends and the bench is skipped).
#   run: bash tests/cuda/attn_h200.sh            (carry: [".carry"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-h200}
exec > >(tee "$OUT/attn_h200.log") 2>&1
source tests/cuda/h200_env.sh
t0=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
h200_build "$BUILD" cuda_test_attention cuda_test_attention_select llmkern_cli llmkern_peers_shim || exit 1
grep "llmkern:" "$OUT/cmake.log"
echo "== built in $(( $(date +%s) - t0 )) s"
"$BUILD/llmkern" list | grep -E "^GPU|attention|cudnn|flash" | head -20
"$BUILD/llmkern" explain --device cuda | grep -E "^OP|^attention"
echo "== tests"
rc=0
for t in cuda_test_attention_select cuda_test_attention; do
  timeout ${ATT_TEST_S:-300} "$BUILD/$t" >"$OUT/$t.log" 2>&1 || rc=1
  grep -E "^\[ *(OK|FAILED|PASSED|  ERROR) |^HANG|refuse|not run|error|Error|assert" "$OUT/$t.log" | head -40
  grep -cE "^  (flash|sdpa|cudnn)" "$OUT/$t.log" | sed "s/^/  $t cases: /"
done
echo "== bench"
if grep -q "^HANG" "$OUT/cuda_test_attention.log" 2>/dev/null; then
  echo "  skipped: a case hung in cuda_test_attention"
else
  env PYTHONUNBUFFERED=1 LK_BENCH_ONLY=attention_rows timeout ${ATT_BENCH_S:-240} \
    python3 bench/peers_cuda.py --build "$BUILD" --out "$OUT" 2>&1 | grep -v "^W[0-9]"
fi
if [ "${ATT_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout ${ATT_NCU_S:-90} ncu --clock-control none --kernel-name regex:"${ATT_NCU_KERNELS:-fa3_fwd|fa2_(fwd|dkv)}" \
    --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    python3 bench/attention_once.py --build "$BUILD" --impl "${ATT_NCU_IMPL:-flash_attention_3}" >"$OUT/ncu.log" 2>&1
  grep -E "fa[23]_|Duration|Throughput|Registers|Achieved Occ|Theoretical Occ|Stall|Warp Cycles|Issued" \
    "$OUT/ncu.log" | head -60
fi
echo "== tests rc $rc, done at $(( $(date +%s) - t0 )) s"
exit $rc
