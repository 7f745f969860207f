#!/usr/bin/env bash
# sass.sh — a CUDA file's sm_90a kernels, read on this CPU machine before any device time: per
# kernel ptxas's registers, spills and C75xx warnings (-Xptxas -v), and its SASS as an instruction
# count and an md5 of the instructions' text (addresses and encodings dropped). Two revisions whose
# kernel has the same md5 compiled to the same machine code: a refactor that keeps every md5 needs
# no device run, and a kernel change's instruction count is known before it is timed (bench/NOTES.md,
# fifty-second session: a mask-kind refactor checked this way, the CAUSAL backward's 3,136 -> 2,216).
#   bash tests/cuda/sass.sh src/ops/attention/fa3_bwd.cu            the working tree's file
#   bash tests/cuda/sass.sh src/ops/attention/fa3_bwd.cu HEAD~1     that commit's tree (git archive)
#   SASS_DUMP=DIR bash tests/cuda/sass.sh FILE                      also each kernel's SASS text in DIR
# The flags are the release build's for sm_90a (CMakeLists.txt: -O3 -DNDEBUG, C++17, the CUDA defines).
# cuobjdump and nvdisasm are the toolkit's when it has them, else PyPI's nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm wheels unpacked into ~/.cache/llmkern-sass (this machine's nvcc has neither).
set -euo pipefail
cd "$(dirname "$0")/../.."
FILE=${1:?usage: sass.sh FILE.cu [REV]}
TREE=$PWD TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ -n "${2:-}" ]; then
  TREE=$TMP/tree && mkdir -p "$TREE" && git archive "$2" src include | tar -x -C "$TREE"
fi
if ! command -v nvdisasm >/dev/null; then
  TOOLS=${XDG_CACHE_HOME:-$HOME/.cache}/llmkern-sass
  if [ ! -x "$TOOLS/bin/nvdisasm" ]; then
    mkdir -p "$TOOLS/whl" "$TOOLS/bin"
    python3 -m pip download -q --no-deps -d "$TOOLS/whl" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for w in "$TOOLS"/whl/*.whl; do python3 -m zipfile -e "$w" "$TOOLS/whl/x"; done
    find "$TOOLS/whl/x" -type f \( -name cuobjdump -o -name nvdisasm \) -exec cp {} "$TOOLS/bin/" \;
    chmod +x "$TOOLS"/bin/*
  fi
  export PATH=$TOOLS/bin:$PATH
fi
nvcc -arch=sm_90a -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -I"$TREE/include" -I"$TREE/src" \
  -DLLMKERN_HAVE_CUDA=1 -DLLMKERN_HAVE_CUDNN=1 -DLLMKERN_HAVE_NCCL=1 -cubin -Xptxas -v -o "$TMP/k.cubin" \
  "$TREE/$FILE" 2> "$TMP/ptxas.txt"
cuobjdump -sass "$TMP/k.cubin" > "$TMP/k.sass"
python3 - "$TMP/ptxas.txt" "$TMP/k.sass" "${SASS_DUMP:-}" <<'EOF'
import hashlib, os, re, sys
info, name = {}, None   # kernel: [registers, spilled bytes, C75xx warnings]
for l in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '(\w+)'", l)
    if m: name = m.group(1); info[name] = ["?", "?", ""]; continue
    if not name: continue
    m = re.search(r"Used (\d+) registers", l) or re.search(r"(\d+) bytes spill stores", l)
    if m: info[name][0 if "Used" in l else 1] = m.group(1)
    if re.search(r"C75\d\d", l): info[name][2] += " " + l.strip()
code, fn = {}, None
for l in open(sys.argv[2]):
    m = re.search(r"Function : (\S+)", l)
    if m: fn = m.group(1); code[fn] = []; continue
    m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", l)
    if m and fn: code[fn].append(m.group(1))
for f in sorted(code):
    body = "\n".join(code[f]) + "\n"
    r = info.get(f, ["?", "?", ""])
    print(f"{hashlib.md5(body.encode()).hexdigest()[:12]} {len(code[f]):6d}  {f[:64]:64s} {r[0]} regs, {r[1]} B spilled{r[2]}")
    if sys.argv[3]:
        os.makedirs(sys.argv[3], exist_ok=True)
        open(os.path.join(sys.argv[3], f[:120] + ".sass"), "w").write(body)
EOF
