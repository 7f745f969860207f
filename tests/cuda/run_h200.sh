#!/usr/bin/env bash
# run_h200.sh — everything GPU in one go, for the H200 machine (the device tool's `run`):
# builds llmkern with CUDA, prints `llmkern list`'s GPU line, runs the GPU tests (ctest -R
# cuda_), the Python tests with their CUDA cases (python/tests/run.sh) and
# bench/peers_cuda.py, and leaves the logs and the bench's table in $OUT.
#
# That machine has nvcc, CMake and PyTorch but not necessarily libyaml, cmocka, OpenBLAS,
# jansson, cairo or pkg-config: carry their .debs in .carry/debs (apt-get download
# libyaml-0-2 libyaml-dev libcmocka0 libcmocka-dev libopenblas0-pthread
# libopenblas-pthread-dev libopenblas-dev libgfortran5 pkgconf pkgconf-bin libpkgconf3
# libjansson4 libjansson-dev libcairo2 libcairo2-dev libpixman-1-0 libfontconfig1
# libfreetype6 libpng16-16 libxcb-render0 libxcb-shm0 libxcb1 libx11-6 libx11-data libxext6
# libxrender1 libxau6 libxdmcp6 libbsd0 libmd0 libbrotli1 libexpat1 libbz2-1.0 zlib1g
# fonts-dejavu-core fontconfig-config; h200_env.sh keeps of the runtime ones only what the
# host lacks), and the wheels of Liger-Kernel,
# nvidia-cudnn-frontend (the cudnn row's headers) and pytest, pluggy, iniconfig (the
# Python tests, when that python3 has no pytest) in .carry/whl;
# both are unpacked into .carry/ there, never into /. tests/cuda/carry.sh fetches them all.
#   run: bash tests/cuda/run_h200.sh            (carry: [".carry"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-h200}
exec > >(tee "$OUT/run_h200.log") 2>&1
source tests/cuda/h200_env.sh   # the carried packages and wheels, h200_build, NVLink multicast off

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
echo "== build"
h200_build "$BUILD" || exit 1
"$BUILD/llmkern" list | grep -E "^GPU|cuda " | head -12
echo "== GPU tests"
ctest --test-dir "$BUILD" -R cuda_ --output-on-failure -j 3 2>&1 | tee "$OUT/ctest_cuda.log" | tail -15
tests_rc=${PIPESTATUS[0]}
echo "== python tests (python/tests: each op against transformers on the CPU and the GPU, f32 and bf16; the"
echo "   patched tiny Qwen3 / Qwen3-MoE trained 20 steps against the unpatched one, bf16 on the GPU)"
bash python/tests/run.sh "$BUILD" 2>&1 | tee "$OUT/python_tests.log" | tail -25
py_rc=${PIPESTATUS[0]}
echo "== bench"
PYTHONUNBUFFERED=1 python3 bench/peers_cuda.py --build "$BUILD" --out "$OUT" 2>&1 | grep -v "^W[0-9]" 
bench_rc=${PIPESTATUS[0]}
echo "== tests rc $tests_rc, python tests rc $py_rc, bench rc $bench_rc"
cat "$OUT/peers_cuda.md" 2>/dev/null
exit $(( tests_rc != 0 || (py_rc != 0 && py_rc != 77) ? 1 : 0 ))
