#!/usr/bin/env bash
# carry.sh — fills .carry/ (git-ignored) with what the H200 machine lacks, on a machine that
# can reach Debian and PyPI (this one): the .debs tests/cuda/run_h200.sh names (libyaml,
# cmocka, OpenBLAS, jansson, cairo and their runtime libraries, pkg-config) and the wheels
# of Liger-Kernel, nvidia-cudnn-frontend (for the H200's python 3.12: the cudnn row's
# headers) and pytest. A fresh checkout has no .carry: run this before the first device
# call, then carry [".carry"] (h200_env.sh unpacks them there, never into /).
#   run: bash tests/cuda/carry.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/debs .carry/whl
(cd .carry/debs && apt-get download libyaml-0-2 libyaml-dev libcmocka0 libcmocka-dev libopenblas0-pthread \
  libopenblas-pthread-dev libopenblas-dev libgfortran5 pkgconf pkgconf-bin libpkgconf3 libjansson4 libjansson-dev \
  libcairo2 libcairo2-dev libpixman-1-0 libfontconfig1 libfreetype6 libpng16-16 libxcb-render0 libxcb-shm0 libxcb1 \
  libx11-6 libx11-data libxext6 libxrender1 libxau6 libxdmcp6 libbsd0 libmd0 libbrotli1 libexpat1 libbz2-1.0 zlib1g \
  fonts-dejavu-core fontconfig-config)
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 -d .carry/whl \
  liger_kernel==0.8.5 nvidia-cudnn-frontend==1.32.0 pytest pluggy iniconfig
ls .carry/debs | wc -l | xargs echo "debs:"
ls .carry/whl
