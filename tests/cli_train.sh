#!/usr/bin/env bash
# cli_train.sh — `llmkern train` as a user runs it: a tiny config trains a few steps
# and leaves config.json, model.safetensors, loss.csv, loss.png and a checkpoint; it
# resumes from the output directory; usage and config errors exit 2 with the place.
# Run: bash tests/cli_train.sh build/llmkern .
set -u
bin=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { if grep -qE -- "$3" <<<"$2"; then ok; else fail "$1: /$3/ not in:"; echo "$2" | tail -20; fi; }

cat >"$tmp/tiny.yaml" <<'YAML'
model: { hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16,
         intermediate_size: 64, vocab_size: 320, num_experts: 4, num_experts_per_tok: 2,
         moe_intermediate_size: 32, torch_dtype: float32 }
train: { steps: 4, batch_size: 2, seq_len: 32, save_every: 2, warmup_steps: 1 }
data: { corpus: builtin, docs: 32 }
YAML
out=$(OMP_NUM_THREADS=2 "$bin" train --config "$tmp/tiny.yaml" --out "$tmp/run" --steps 3 2>&1); rc=$?
[ $rc -eq 0 ] && ok || fail "train exit $rc"
expect "progress lines (not a terminal: one per step)" "$out" '^step 3/3 \| loss [0-9.]+ \| lr .* \| grad norm .* tok/s \| ETA'
expect "summary" "$out" 'done: steps 1\.\.3'
for f in config.json model.safetensors loss.csv loss.png latest checkpoint-2/optimizer.safetensors checkpoint-3/model.safetensors; do
  [ -s "$tmp/run/$f" ] && ok || fail "missing $f"
done
[ "$(wc -l <"$tmp/run/loss.csv")" -eq 4 ] && ok || fail "loss.csv: expected a header and 3 rows"
expect "loss.csv header" "$(head -1 "$tmp/run/loss.csv")" '^step,loss,lr,grad_norm,tokens_per_s$'

out=$(OMP_NUM_THREADS=2 "$bin" train --config "$tmp/tiny.yaml" --out "$tmp/run" --steps 4 --resume "$tmp/run" 2>&1); rc=$?
[ $rc -eq 0 ] && ok || fail "resume exit $rc: $out"
expect "resume continues at step 4" "$out" 'done: steps 4\.\.4'
[ "$(wc -l <"$tmp/run/loss.csv")" -eq 5 ] && ok || fail "loss.csv after resume: expected 4 rows"

out=$("$bin" explain --config "$tmp/tiny.yaml" 2>&1); rc=$?
[ $rc -eq 0 ] && ok || fail "explain exit $rc"
expect "explain takes the family from the config's model" "$out" 'model family qwen3_moe'

out=$("$bin" train 2>&1); rc=$?
[ $rc -eq 2 ] && ok || fail "no --config: exit $rc"
expect "no --config" "$out" '--config FILE is required'
printf 'train:\n  lr: fast\n' >"$tmp/bad.yaml"
out=$("$bin" train --config "$tmp/bad.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] && ok || fail "bad config: exit $rc"
expect "bad config names the place" "$out" "bad.yaml:2:7: train.lr: expected a finite number"

out=$("$bin" train --config "$tmp/tiny.yaml" --out "$tmp/dev" --device tpu 2>&1); rc=$?
[ $rc -eq 2 ] && ok || fail "--device tpu: exit $rc"
expect "--device tpu" "$out" "--device: expected cpu or cuda, got 'tpu'"
printf 'train:\n  device: gpu\n' >"$tmp/dev.yaml"
out=$("$bin" train --config "$tmp/dev.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] && ok || fail "train.device gpu: exit $rc"
expect "train.device names the place" "$out" "dev.yaml:2:11: train.device: expected cpu or cuda"
if ! "$bin" list 2>/dev/null | grep -q '^GPU: NVIDIA'; then   # no GPU here: --device cuda says why, writes nothing
  out=$("$bin" train --config "$tmp/tiny.yaml" --out "$tmp/dev" --device cuda 2>&1); rc=$?
  [ $rc -eq 2 ] && ok || fail "--device cuda without a GPU: exit $rc"
  expect "--device cuda without a GPU" "$out" "train: device:? cuda: (no GPU here|this build cannot train there)"
  [ ! -e "$tmp/dev" ] && ok || fail "--device cuda without a GPU wrote $tmp/dev"
fi

echo "cli_train: $passes passed, $fails failed"
[ $fails -eq 0 ]
