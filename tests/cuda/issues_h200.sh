#!/usr/bin/env bash
# issues_h200.sh — the open GPU issues' measurements in one device call, on tests/cuda/prebuild.sh's
# binaries (no build there): a change's GPU tests first, then issue 16's table (bench/ab.sh's
# attention rows: flash_attention_3, cudnn and flash_attention_2 beside SDPA's backends, the B side
# and, where .prebuilt/alt is packed, the A side alternately), and on an H200 (EXTRA=1: anywhere;
# EXTRA=0: nowhere) issue 19's flex beside torch's compiled flex and issue 17's dense e2e beside Liger, on B. Each part's
# logs land in $OUT; a failing test stops the call before any bench.
#   here:   bash tests/cuda/prebuild.sh cuda_test_attention llmkern_cli llmkern_peers_shim
#           ALT=main bash tests/cuda/prebuild.sh                     (the A side, optional)
#   device: bash tests/cuda/issues_h200.sh                          (carry: [".carry", ".prebuilt"])
#           TESTS="cuda_test_attention:fa3_*" ROUNDS=2 bash tests/cuda/issues_h200.sh
# TESTS: PROGRAM[:FILTER] ... (LK_TEST_FILTER, cmocka's name pattern), default none; ROUNDS of the
# A/B (default 2; 0 skips it). ~25 s a side a round, ~100 s for flex, ~200 s for the e2e: on an
# H200 with tests, run EXTRA=0 first and then `TESTS= ROUNDS=0 bash ...` to stay in one call's 600 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/issues_h200.log") 2>&1
nvidia-smi --query-gpu=name,power.limit,temperature.gpu,clocks.sm --format=csv
source tests/cuda/h200_env.sh >/dev/null 2>&1
source tests/cuda/prebuilt_env.sh
export LD_LIBRARY_PATH=${LK_TORCH_CUDNN:+$LK_TORCH_CUDNN:}/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
t0=$SECONDS
for t in ${TESTS:-}; do
  prog=${t%%:*} filter=
  [ "$prog" = "$t" ] || filter=${t#*:}
  echo "== $prog ${filter:+($filter)}"
  LK_TEST_FILTER=$filter timeout ${TEST_S:-300} "$B/$prog" >"$OUT/$prog.log" 2>&1
  rc=$?
  grep -E "^\[ *(FAILED|PASSED|  ERROR) |^HANG" "$OUT/$prog.log" | head -20
  echo "   rc $rc, $((SECONDS - t0)) s"
  [ $rc = 0 ] || { tail -30 "$OUT/$prog.log"; exit 1; }
done
if [ "${ROUNDS:-2}" != 0 ]; then
  echo "== issue 16: attention rows, $(head -1 .prebuilt/rev)${A:+ (B) against $(head -1 .prebuilt/alt_rev) (A)}"
  bash bench/ab.sh attention_rows "${ROUNDS:-2}" "$B" ${A:+"$A"} >/dev/null
  python3 bench/ab_table.py "$OUT" | tee "$OUT/ab_table.md"
  echo "   $((SECONDS - t0)) s"
fi
case ${EXTRA:-auto} in
  0) exit 0 ;;
  auto) nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0 ;;
esac
echo "== issue 19: flex beside torch's compiled flex"
timeout ${FLEX_S:-200} python3 bench/flex_peers.py --build "$B" --torch-s 150 --out "$OUT/flex" 2>&1 | grep -v "^W[0-9]" | tail -25
echo "   $((SECONDS - t0)) s"
echo "== issue 17: dense e2e beside Liger"
timeout ${E2E_S:-240} python3 bench/e2e_peers.py --llmkern "$B/llmkern" --configs dense --steps 10 --warmup 2 \
  --runs "liger,llmkern+keepqk+bf16m+bf16w+bf16g+bf16r+gemmtune+lean" --run-timeout 100 --out "$OUT/e2e" 2>&1 | tail -20
echo "   $((SECONDS - t0)) s"
