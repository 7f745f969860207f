#!/usr/bin/env bash
# run.sh BUILD [sanitized] — the Python tests (python/tests) against BUILD's library, as
# ctest's python_tests runs them: BUILD/python (the build tree's package, CMake's
# links to python/llmkern and libllmkern.so) first on the path. The interpreter is the
# first of $LLMKERN_PYTHON, python3, BUILD/venv/bin/python that has torch, transformers
# and pytest (make test installs them into BUILD/venv: python/install-deps.sh);
# with none, or in a sanitized build (an ASan library cannot be loaded into a Python that
# was not started with libasan preloaded), it says why and exits 77, which ctest counts
# as skipped. On a GPU machine the same tests also run their CUDA cases:
#   bash python/tests/run.sh build-h200          (tests/cuda/run_h200.sh does)
set -uo pipefail
BUILD=$(cd "${1:?usage: run.sh BUILD [sanitized]}" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ "${2:-}" = sanitized ]; then
  echo "python tests: skipped in the sanitized build (libasan must be preloaded into the interpreter;" \
       "the release build runs them)"
  exit 77
fi
have() { "$1" -c "import torch, transformers, pytest" >/dev/null 2>&1; }
PY=""
for c in "${LLMKERN_PYTHON:-}" python3 "$BUILD/venv/bin/python"; do
  if [ -n "$c" ] && have "$c"; then PY=$c; break; fi
done
if [ -z "$PY" ]; then
  echo "python tests: skipped: no python with torch, transformers and pytest (make test installs them into" \
       "$BUILD/venv: bash python/install-deps.sh $BUILD/venv)"
  exit 77
fi
"$PY" -c "import torch, transformers; print('python tests:', '$PY', 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
cd "$ROOT"
PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 "$PY" -m pytest -q -p no:cacheprovider \
  -o console_output_style=classic python/tests "${@:3}"
