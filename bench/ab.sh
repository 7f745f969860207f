#!/usr/bin/env bash
# ab.sh — an A/B of builds in one device call: bench/peers_cuda.py's part PART (LK_BENCH_ONLY:
# moe_rows, attention_rows, ...) on the B side ($B: tests/cuda/prebuild.sh's build) and the A side
# ($A: `ALT=<rev> bash tests/cuda/prebuild.sh`) in turn, B A B A ..., ROUNDS times each, so both
# see the same clocks and the same peers (the peers moved 5-15% between calls; alternating runs in
# one call made 2-8% differences readable: bench/NOTES.md, thirteenth session). Build folders
# named after ROUNDS replace B and A (an A/B/C/...; each side is labelled by its folder's name);
# a side DIR,VAR=VALUE,... runs that build with those variables set (one build's schedules
# against each other; labelled by the folder and the values). Each run's output lands in
# $OUT/ab_<part>_<side><round>.log; its table rows are printed with the side in front. The
# environment passes through to every side (LLMKERN_GG_SM90=coop, LK_MOE_LIGER=0, ...).
#   device: source tests/cuda/h200_env.sh; source tests/cuda/prebuilt_env.sh; bash bench/ab.sh moe_rows 2
#           bash bench/ab.sh attention_rows 2 "$B" /tmp/defer "$A"
#           LK_MOE_LIGER=0 bash bench/ab.sh moe_rows 2 "$B" "$B,LLMKERN_GG_SM90=coop_cluster"
#   then, anywhere: python3 bench/ab_table.py $OUT [--ms] [--grep gemm]   (the sides in columns; at
#   most 9 rounds)
set -uo pipefail
PART=${1:?usage: ab.sh PART [ROUNDS] (PART: a part of bench/peers_cuda.py, as LK_BENCH_ONLY takes)}
ROUNDS=${2:-2}
case $ROUNDS in [1-9]) ;; *) echo "ab.sh: ROUNDS is 1-9 (the logs' names end in it), got $ROUNDS" >&2; exit 2 ;; esac
shift $(($# < 2 ? $# : 2))
SIDES=("$@")
if [ ${#SIDES[@]} -eq 0 ]; then
  if [ -z "${A:-}" ] || [ -z "${B:-}" ]; then
    echo "ab.sh: no A or B side: source tests/cuda/prebuilt_env.sh with .prebuilt/alt.tar.xz packed" >&2
    exit 2
  fi
  SIDES=("$B" "$A")
fi
for S in "${SIDES[@]}"; do
  D=${S%%,*}
  [ -x "$D/llmkern" ] || { echo "ab.sh: $D holds no llmkern build" >&2; exit 2; }
  # peers_cuda.py loads the shim; a prebuild of named targets packs only those
  [ -f "$D/libllmkern_peers_shim.so" ] ||
    { echo "ab.sh: $D has no libllmkern_peers_shim.so (prebuild.sh ... llmkern_peers_shim)" >&2; exit 2; }
done
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for S in "${SIDES[@]}"; do
    D=${S%%,*} VARS=()
    [ "$S" = "$D" ] || IFS=, read -ra VARS <<<"${S#*,}"
    side=$(basename "$D")
    for v in "${VARS[@]}"; do side+=_${v#*=}; done
    log=$OUT/ab_${PART}_$side$r.log
    env "${VARS[@]}" LD_LIBRARY_PATH=${LK_TORCH_CUDNN:+$LK_TORCH_CUDNN:}$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      LK_BENCH_ONLY=$PART python3 bench/peers_cuda.py --build "$D" --out "$OUT/ab_$side$r" 2>&1 | grep -v "^W[0-9]" >"$log"
    grep -E "[0-9] ms" "$log" | grep -v "^  check" | sed "s/^/$side$r  /"
  done
done
