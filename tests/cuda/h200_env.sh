# h200_env.sh — sourced by the H200 scripts (run_h200.sh, attn_h200.sh) from the repo root:
# unpacks the carried .debs (.carry/debs: libyaml, cmocka, OpenBLAS, pkgconf) into
# .carry/prefix, never into /, installs the carried wheels (.carry/whl: Liger-Kernel,
# nvidia-cudnn-frontend) into /tmp/site, and sets CARRIED to the CMake arguments that
# find them.
PFX=$PWD/.carry/prefix
LIB=$PFX/usr/lib/x86_64-linux-gnu
if ls .carry/debs/*.deb >/dev/null 2>&1; then
  mkdir -p "$PFX"
  for f in .carry/debs/*.deb; do dpkg -x "$f" "$PFX"; done
  sed -i "s|^prefix=/usr|prefix=$PFX/usr|" "$LIB"/pkgconfig/*.pc
  ln -sf openblas-pthread/libopenblas.so.0 "$LIB/libopenblas.so"      # what FindBLAS looks for
  export PKG_CONFIG_PATH=$LIB/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$LIB:$LIB/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  command -v pkg-config >/dev/null || export PKG_CONFIG=$PFX/usr/bin/pkgconf
  CARRIED=(-DCMAKE_LIBRARY_PATH="$LIB" -DCBLAS_INCLUDE_DIR="$PFX/usr/include/x86_64-linux-gnu/openblas-pthread")
else
  CARRIED=()
fi
if ls .carry/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .carry/whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

