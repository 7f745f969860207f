# h200_env.sh — sourced by the H200 scripts (run_h200.sh, attn_h200.sh, moe_h200.sh, e2e_h200.sh,
# dist_h200.sh) from the repo root: turns NVLink multicast off (multi-GPU hosts are shared; KINDS.md),
# unpacks the carried .debs (.carry/debs: libyaml, cmocka, OpenBLAS, pkgconf, jansson,
# cairo and the runtime libraries cairo needs) into .carry/prefix, never into /, installs
# the carried wheels (.carry/whl: Liger-Kernel, nvidia-cudnn-frontend) into /tmp/site, and
# sets CARRIED to the CMake arguments that find them. A carried runtime library the host
# already has is dropped again (a copy on LD_LIBRARY_PATH would shadow the host's for
# every program of the run: python's pyexpat on an older libexpat, say); what is linked
# by name (a -dev package's libX.so) stays.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PFX=$PWD/.carry/prefix
LIB=$PFX/usr/lib/x86_64-linux-gnu
if ls .carry/debs/*.deb >/dev/null 2>&1; then
  mkdir -p "$PFX"
  for f in .carry/debs/*.deb; do dpkg -x "$f" "$PFX"; done
  sed -i "s|^prefix=/usr|prefix=$PFX/usr|" "$LIB"/pkgconfig/*.pc
  ln -sf openblas-pthread/libopenblas.so.0 "$LIB/libopenblas.so"      # what FindBLAS looks for
  LDCONFIG=$(command -v ldconfig || echo /sbin/ldconfig)
  if [ -x "$LDCONFIG" ]; then
    HOST_SONAMES=$("$LDCONFIG" -p 2>/dev/null | awk '{print $1}')
    LINKED=$(for l in "$LIB"/*.so; do readlink -f "$l"; done)        # what a libX.so link points at
    for so in "$LIB"/lib*.so.* "$PFX"/lib/x86_64-linux-gnu/lib*.so.*; do
      [ -e "$so" ] || continue
      grep -qxF "$(readlink -f "$so")" <<<"$LINKED" && continue      # linked by name: keep
      grep -qxF "${so##*/}" <<<"$HOST_SONAMES" && rm -f "$so"
    done
  fi
  # cairo's labels: the carried DejaVu face, when the host has no fontconfig setup of its own
  if [ ! -e /etc/fonts/fonts.conf ] && [ -d "$PFX/usr/share/fonts" ]; then
    printf '<?xml version="1.0"?>\n<fontconfig><dir>%s</dir><cachedir>%s</cachedir></fontconfig>\n' \
      "$PFX/usr/share/fonts" "$PFX/fontconfig-cache" >"$PFX/fonts.conf"
    export FONTCONFIG_FILE=$PFX/fonts.conf
  fi
  export PKG_CONFIG_PATH=$LIB/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$LIB:$LIB/openblas-pthread:$PFX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  command -v pkg-config >/dev/null || export PKG_CONFIG=$PFX/usr/bin/pkgconf
  CARRIED=(-DCMAKE_LIBRARY_PATH="$LIB" -DCMAKE_INCLUDE_PATH="$PFX/usr/include"
           -DCBLAS_INCLUDE_DIR="$PFX/usr/include/x86_64-linux-gnu/openblas-pthread")
else
  CARRIED=()
fi
if ls .carry/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .carry/whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# h200_build DIR [TARGET ...]: configures DIR (Release, CUDA, the carried packages) and builds the
# targets (everything without any), logs in $OUT/cmake.log and $OUT/build.log; on a failure prints
# what failed and returns 1: `h200_build "$BUILD" ... || exit 1`.
h200_build() {
  local dir=$1
  shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLMKERN_CUDA=ON "${CARRIED[@]}" >"$OUT/cmake.log" 2>&1 ||
    { tail -30 "$OUT/cmake.log"; return 1; }
  cmake --build "$dir" -j "$(nproc)" ${1:+--target} "$@" >"$OUT/build.log" 2>&1 ||
    { if grep -q error "$OUT/build.log"; then grep -E "error" -A3 "$OUT/build.log" | head -40
      else tail -20 "$OUT/build.log"; fi; return 1; }
}
