#!/usr/bin/env bash
# Installs what llmkern needs to build and test on Debian, and nothing that is already there.
# Idempotent: `make run` and `make test` call it every time; a machine that has everything does nothing.
set -euo pipefail
need=(cmake make gcc pkg-config libyaml-dev libcmocka-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
