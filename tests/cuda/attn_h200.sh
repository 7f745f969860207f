#!/usr/bin/env bash
# attn_h200.sh — the attention rows on the H200 in one call: builds only what attention
# needs (the library, its GPU tests, the CLI and the bench's shim), runs the GPU attention
# tests, `llmkern list` / `explain --device cuda`, then the attention part of
# bench/peers_cuda.py (every CUDA attention row beside SDPA's cuDNN and flash backends).
# Logs and the bench's table land in $OUT. ATT_NCU=1 adds one Nsight Compute profile of
# each row's forward at the peers' shape.
#   run: bash tests/cuda/attn_h200.sh            (carry: [".carry"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-h200}
exec > >(tee "$OUT/attn_h200.log") 2>&1
source tests/cuda/h200_env.sh

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLMKERN_CUDA=ON "${CARRIED[@]}" >"$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
grep "llmkern:" "$OUT/cmake.log"
cmake --build "$BUILD" -j "$(nproc)" --target cuda_test_attention cuda_test_attention_select llmkern_cli \
  llmkern_peers_shim >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
"$BUILD/llmkern" list | grep -E "^GPU|attention|cudnn|flash" | head -20
"$BUILD/llmkern" explain --device cuda | grep -E "^OP|^attention"
echo "== tests"
rc=0
for t in cuda_test_attention_select cuda_test_attention; do
  timeout 300 "$BUILD/$t" >"$OUT/$t.log" 2>&1 || rc=1
  grep -E "^\[ *(OK|FAILED|PASSED) |refused|not run|error|Error|assert" "$OUT/$t.log" | head -30
  grep -cE "^  (flash|sdpa|cudnn)" "$OUT/$t.log" | sed "s/^/  $t cases: /"
done
echo "== bench"
PYTHONUNBUFFERED=1 LK_BENCH_ONLY=attention_rows timeout ${ATT_BENCH_S:-240} python3 bench/peers_cuda.py \
  --build "$BUILD" --out "$OUT" 2>&1 | grep -v "^W[0-9]"
if [ "${ATT_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  LK_BENCH_ONLY=attention_rows timeout 200 ncu --clock-control none --kernel-name regex:"fa3_fwd|fa2_fwd" --launch-count 2 \
    --section SpeedOfLight --section Occupancy python3 bench/peers_cuda.py --build "$BUILD" --out /tmp \
    >"$OUT/ncu.log" 2>&1; grep -E "fa3_fwd|fa2_fwd|Throughput|Duration|Registers|Achieved Occ" "$OUT/ncu.log" | head -30
fi
echo "== tests rc $rc"
exit $rc
