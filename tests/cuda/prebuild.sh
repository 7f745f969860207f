#!/usr/bin/env bash
# prebuild.sh — builds the CUDA test binaries, the CLI and the bench's shim on this CPU machine
# and packs them for the H200, so a device call only runs them (a build there cost 87-122 s of
# the session's 30 device minutes; here it is 2-3 minutes from scratch, seconds after a change).
# Release, no -march=native (the H200 host is another CPU), no MPI (the device has no libmpi;
# the tests/dist programs are not packed). The binaries link the library statically (18-19 MB
# each); xz's 64 MiB dictionary packs them together into a few MB. Needs scripts/install-deps.sh
# first; .prebuilt/ is git-ignored, carried beside .carry:
#   bash tests/cuda/prebuild.sh [target ...]      (default: every tests/cuda/test_*.c, the CLI, the shim)
#   device: carry [".carry", ".prebuilt"], then `source tests/cuda/h200_env.sh; source
#   tests/cuda/prebuilt_env.sh` and run "$B/cuda_test_..." / bench/*.py --build "$B".
# .prebuilt/rev names the commit (and "+ uncommitted" when the tree differed): check it in the log.
# The A side of an A/B: `ALT=<rev> bash tests/cuda/prebuild.sh` builds commit <rev> (a worktree in
# ../prebuild-alt, built in ../build-alt; default targets the CLI and the shim) into
# .prebuilt/alt.tar.xz and .prebuilt/alt_rev; prebuilt_env.sh unpacks it into A=/tmp/alt, and
# bench/ab.sh runs a bench on B and A alternately in one call (both sides under the same clocks
# and the same peers: the peers moved 5-15% between calls in the thirteenth session).
# More sides: `ALT=wip-x ALT_NAME=x bash tests/cuda/prebuild.sh` packs .prebuilt/x.tar.xz, unpacked
# into /tmp/x; `bash bench/ab.sh PART ROUNDS $B /tmp/x $A` rotates over them. The variants share
# the worktree and ../build-alt, so each after the first rebuilds only what its commit changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD NAME=bins BUILD=${PREBUILD_DIR:-$(cd .. && pwd)/build-pre}
case ${ALT_NAME:-alt} in bins | pre)   # prebuilt_env.sh unpacks bins into B=/tmp/pre: a side named so overwrites B
  echo "prebuild: ALT_NAME ${ALT_NAME} is taken (B's binaries unpack into /tmp/pre); name the side otherwise" >&2
  exit 2 ;;
esac
if [ -n "${ALT:-}" ]; then
  ALT=$(git rev-parse --verify "$ALT^{commit}")   # here, not in the worktree (where HEAD~1 is its own)
  SRC=$(cd .. && pwd)/prebuild-alt NAME=${ALT_NAME:-alt} BUILD=$(cd .. && pwd)/build-alt
  [ -d "$SRC" ] || git worktree add -q --detach "$SRC" "$ALT"
  git -C "$SRC" checkout -q --detach "$ALT"
fi
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  [ -n "${ALT:-}" ] && TARGETS=(llmkern_cli llmkern_peers_shim) ||
    TARGETS=($(ls tests/cuda/test_*.c | sed 's|.*/test_|cuda_test_|; s|\.c$||') llmkern_cli llmkern_peers_shim)
fi
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLMKERN_CUDA=ON \
  -DLLMKERN_NATIVE=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" >/dev/null
mkdir -p .prebuilt
bins=()   # what the targets built, not an older build's leftovers (the tests link the library statically)
for t in "${TARGETS[@]}"; do
  case $t in
    cuda_test_*) bins+=("$t") ;;
    llmkern_cli) bins+=(llmkern libllmkern.so) ;;
    llmkern_peers_shim) bins+=(libllmkern_peers_shim.so libllmkern.so) ;;
    gemm_algos) bins+=(gemm_algos) ;;
    overlap_probe) bins+=(overlap_probe libllmkern.so) ;;
  esac
done
bins=($(printf '%s\n' "${bins[@]}" | sort -u))
tar -C "$BUILD" -cf - "${bins[@]}" | xz -9 -T2 >".prebuilt/$NAME.tar.xz"
REV=.prebuilt/rev; [ "$NAME" = bins ] || REV=.prebuilt/${NAME}_rev
{ git -C "$SRC" log --oneline -1 | cut -c1-72; git -C "$SRC" diff --quiet HEAD -- src include tests bench CMakeLists.txt || echo "+ uncommitted"; } >"$REV"
echo "prebuild: ${#bins[@]} files, $(du -h ".prebuilt/$NAME.tar.xz" | cut -f1) in .prebuilt/$NAME.tar.xz ($(head -1 "$REV"))"
