#!/usr/bin/env bash
# cli_hf_compare.sh — tests/hf_compare.py under ctest: llmkern's sharded checkpoints and
# --init against the Hugging Face reference implementations (safetensors; transformers
# on tiny Qwen3 and Qwen3-MoE models it builds and saves sharded itself; nothing
# downloaded). The interpreter is the first of $LLMKERN_HF_PYTHON, $LLMKERN_PYTHON,
# python3 and <build>/venv/bin/python (where `make test` installs torch and transformers:
# python/install-deps.sh) that has torch and transformers, else the first that has
# safetensors and numpy (part 0 only), else python3: the script then exits 77, which
# ctest reports as skipped.
# Run: bash tests/cli_hf_compare.sh build/llmkern .
set -u
bin=$1; src=$2
cands=("${LLMKERN_HF_PYTHON:-}" "${LLMKERN_PYTHON:-}" python3 "$(dirname "$bin")/venv/bin/python")
py=""
for mods in "torch, transformers" "safetensors, numpy"; do
  for c in "${cands[@]}"; do
    if [ -n "$c" ] && "$c" -c "import $mods" >/dev/null 2>&1; then py=$c; break 2; fi
  done
done
exec "${py:-python3}" "$src/tests/hf_compare.py" "$bin"
