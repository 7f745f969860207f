#!/usr/bin/env bash
# e2e_h200.sh — issue 17's measurements on the H200, one device call a part (each fits the
# device's 600 s a call; the build directory outside the repository survives between calls
# while the machine stays warm, else the part rebuilds it, ~90 s):
#   bash tests/cuda/e2e_h200.sh tests     build, ctest -R cuda_ (GPU tests), the step profile
#   bash tests/cuda/e2e_h200.sh e2e       bench/e2e_peers.py: HF, HF + Liger, llmkern with
#                                         and without train.cuda_graph, dense and MoE
#                                         (E2E_CONFIGS, E2E_RUNS, E2E_RUN_TIMEOUT choose; HF +
#                                         Liger's MoE autotunes for minutes the first time:
#                                         E2E_CONFIGS=moe E2E_RUNS=liger,llmkern
#                                         E2E_RUN_TIMEOUT=400, then keep $OUT/liger_autotune_new.tgz)
#   bash tests/cuda/e2e_h200.sh parity    bench/e2e_peers.py --parity (200 steps bf16 vs f32),
#                                         PARITY_REPEATS (2) sets of weights and batches
# carry [".carry"] (tests/cuda/carry.sh fills it); logs and tables land in $OUT.
# With tests/cuda/prebuild.sh's binaries (carry [".carry", ".prebuilt"]): `source
# tests/cuda/prebuilt_env.sh && bash tests/cuda/e2e_h200.sh e2e` runs them (B=/tmp/pre), no build.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source tests/cuda/h200_env.sh >/dev/null 2>&1
B=${B:-$(cd .. && pwd)/build-e2e}
export B
t0=$(date +%s)
if [ ! -x "$B/llmkern" ] || [ "${1:-tests}" = tests ]; then
  h200_build "$B" || exit 1
  echo "built in $(( $(date +%s) - t0 )) s"
fi
case "${1:-tests}" in
tests)
  ctest --test-dir "$B" -R cuda_ -j 3 --output-on-failure >"$OUT/ctest.log" 2>&1
  echo "ctest rc $?"; grep -E "tests passed|\*\*\*Failed|FAILED" "$OUT/ctest.log" | head -20
  for t in cuda_test_model cuda_test_train_graph; do "$B/$t" 2>&1 | grep -E "^  " | head -12; done
  timeout 240 python3 bench/step_profile.py --llmkern "$B/llmkern" --model dense --out "$OUT" 2>&1 | head -24 ;;
e2e)
  timeout $(( 590 - $(date +%s) + t0 )) python3 bench/e2e_peers.py --llmkern "$B/llmkern" --out "$OUT" --steps 20 \
    --warmup 4 --configs "${E2E_CONFIGS:-dense,moe}" --runs "${E2E_RUNS:-hf,liger,llmkern,llmkern_graph}" \
    --run-timeout "${E2E_RUN_TIMEOUT:-150}" 2>&1 | grep -v "^W[0-9]" | tail -40 ;;
parity)
  timeout $(( 590 - $(date +%s) + t0 )) python3 bench/e2e_peers.py --llmkern "$B/llmkern" --out "$OUT" --parity \
    --parity-repeats "${PARITY_REPEATS:-2}" 2>&1 |
    grep -v "^W[0-9]" | tail -20 ;;
esac
echo "t=$(( $(date +%s) - t0 )) s"
