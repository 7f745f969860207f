#!/usr/bin/env bash
# dist_h200.sh — issue 24 in one device call, on a machine of 2 or more GPUs (the device tool's
# nvidia-h200-x2 / -x4 kinds): builds llmkern with CUDA, NCCL and MPI as run_h200.sh does, then
#   1. the multi-GPU tests (ctest -R cuda_dist_: dist_train's DP/SP/EP meshes against one GPU,
#      dist_attention's Ulysses rows, dist_moe, dist_nccl; -np 4 ones skip (77) on 2 GPUs);
#   2. the all-to-all's bus bandwidth from 1 MiB to 1 GiB (cuda_dist_nccl, all the GPUs);
#   3. bench/dist_e2e.py: the MoE config at dp N against ep 2 / 4 and the dense model at seq
#      32k against sp 2 / 4, tokens/s.
# Everything lands in $OUT (dist_h200.log, ctest_dist.log, dist_nccl.log, dist_e2e.md). The
# GPU time is mostly step 3 (each mesh trains ~25 steps); DIST_E2E=0 leaves it out.
#   run: bash tests/cuda/dist_h200.sh            (carry: [".carry"], kind nvidia-h200-x2 or -x4)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-h200}
exec > >(tee "$OUT/dist_h200.log") 2>&1
source tests/cuda/h200_env.sh   # the carried packages, h200_build, NVLink multicast off

N=$(nvidia-smi -L | grep -c '^GPU')
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used --format=csv
if [ "$N" -lt 2 ]; then
  echo "dist_h200: $N GPU here; issue 24's runs need 2 or more (one GPU a rank: NCCL refuses two ranks on one GPU)"
  exit 77
fi
echo "== build ($N GPUs)"
h200_build "$BUILD" || exit 1
grep -q "building the MPI communicator" "$OUT/cmake.log" ||
  { echo "dist_h200: CMake found no MPI here (cmake.log): the multi-GPU tests and the trainer's mesh need it"; exit 1; }
MPIEXEC=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")

echo "== multi-GPU tests"
ctest --test-dir "$BUILD" -R cuda_dist_ --output-on-failure 2>&1 | tee "$OUT/ctest_dist.log" | tail -20
tests_rc=${PIPESTATUS[0]}

echo "== the all-to-all's bus bandwidth, $N ranks"
timeout 300 "$MPIEXEC" --allow-run-as-root -np "$N" -x NCCL_NVLS_ENABLE=0 -x OMP_NUM_THREADS=1 \
  "$BUILD/cuda_dist_nccl" >"$OUT/dist_nccl.log" 2>&1
nccl_rc=$?
tail -30 "$OUT/dist_nccl.log"

e2e_rc=0
if [ "${DIST_E2E:-1}" != 0 ]; then
  echo "== tokens/s over the meshes (bench/dist_e2e.py)"
  PYTHONUNBUFFERED=1 python3 bench/dist_e2e.py --llmkern "$BUILD/llmkern" --np "$N" --mpirun "$MPIEXEC" \
    --out "$OUT" 2>&1 | tail -30
  e2e_rc=${PIPESTATUS[0]}
  cat "$OUT/dist_e2e.md" 2>/dev/null
fi
echo "== multi-GPU tests rc $tests_rc, bandwidth rc $nccl_rc, dist_e2e rc $e2e_rc"
exit $(( tests_rc != 0 || nccl_rc != 0 || e2e_rc != 0 ? 1 : 0 ))
