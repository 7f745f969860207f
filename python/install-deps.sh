#!/usr/bin/env bash
# install-deps.sh VENV — what the Python tests need (torch, transformers, pytest), in a
# venv at VENV, unless a python3 on the PATH already has them or VENV does. Called by
# `make test` (VENV = <build>/venv). From PyPI: torch's Linux wheel brings its CUDA
# libraries too (~5.6 GB installed; 266 s on a 2-core machine, bench/NOTES.md). A failed
# install is reported, not fatal: python/tests/run.sh then skips the tests and says why.
set -uo pipefail
VENV=${1:?usage: install-deps.sh VENV}
have() { "$1" -c "import torch, transformers, pytest" >/dev/null 2>&1; }
if [ -n "${LLMKERN_PYTHON:-}" ] && have "$LLMKERN_PYTHON"; then exit 0; fi
if have python3; then exit 0; fi
if [ -x "$VENV/bin/python" ] && have "$VENV/bin/python"; then exit 0; fi
echo "python deps: installing torch, transformers, pytest into $VENV (PyPI; a few minutes)"
start=$(date +%s)
{ [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"; } &&
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch transformers pytest
rc=$?
echo "python deps: pip exit $rc after $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] || echo "python deps: could not install them; the python tests will be skipped (python/tests/run.sh)"
exit 0
