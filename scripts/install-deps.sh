#!/usr/bin/env bash
# Installs what llmkern needs to build and test on Debian, and nothing that is already there.
# Idempotent: `make run` and `make test` call it every time; a machine that has everything does nothing.
set -euo pipefail
# python3 + python3-venv: scripts/tokenize.py puts `tokenizers` in a venv of its own (tests/test_tokenize.c)
# libjansson-dev: config.json and safetensors headers (src/model/json.c); libcairo2-dev and a
# font for its labels (fonts-dejavu-core): loss.png (src/train/plot.c)
need=(cmake make gcc pkg-config libyaml-dev libcmocka-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin python3 python3-venv
      libjansson-dev libcairo2-dev fonts-dejavu-core)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# cudnn-frontend (issue 16): the header-only C++ the `cudnn` attention row builds on, wanted
# only where CUDA is; pip's wheel puts the headers in site-packages/include, where CMake
# looks. Without nvcc, or when pip cannot, nothing changes (the row is left out).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  if ! python3 -c "import sys, site, os; ps = sys.path + [site.getusersitepackages()]; sys.exit(not any(os.path.isfile(os.path.join(p, 'include', 'cudnn_frontend.h')) for p in ps))" 2>/dev/null; then
    echo "install-deps: installing the cudnn-frontend headers (pip install --user nvidia-cudnn-frontend)"
    python3 -m pip install -q --user --no-deps nvidia-cudnn-frontend 2>/dev/null ||
      python3 -m pip install -q --user --no-deps --break-system-packages nvidia-cudnn-frontend ||
      echo "install-deps: could not install nvidia-cudnn-frontend; the cudnn attention row is left out"
  fi
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
