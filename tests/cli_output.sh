#!/usr/bin/env bash
# cli_output.sh — the llmkern command's output (issue 21, items 4-5): list and explain fit
# in 120 columns with no trailing spaces (on a CUDA build too: run it on one), a reason
# many rows share said once, the names a build lacks in their own section; --json written
# with correct escaping (quote, backslash, tab, bytes that are not UTF-8) and non-finite
# numbers as null; bench's named cases (--mask, --kv-heads, --block), every bad value
# refused before anything is timed, naming the option with expected vs got; train --json
# one object per step. Run: bash tests/cli_output.sh build/llmkern .
set -u
bin=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() {  # expect NAME TEXT PATTERN: PATTERN (grep -E) must occur in TEXT
  if grep -qE -- "$3" <<<"$2"; then ok; else fail "$1: /$3/ not in:"; echo "$2" | head -20; fi
}
absent() { if grep -qE -- "$3" <<<"$2"; then fail "$1: /$3/ found in:"; echo "$2" | head -20; else ok; fi; }
fits() {   # fits NAME TEXT: every line at most 120 columns, none ending in a space
  local wide trail
  wide=$(awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }' <<<"$2")
  [ "$wide" -le 120 ] && ok || fail "$1: a line of $wide columns: $(awk 'length($0) > 120' <<<"$2" | head -3)"
  trail=$(grep -c ' $' <<<"$2")
  [ "$trail" -eq 0 ] && ok || fail "$1: $trail lines end in a space: $(grep -n ' $' <<<"$2" | head -3)"
  echo "$1: widest line $wide columns"
}
json_ok() {  # json_ok NAME TEXT [lines]: valid JSON (one document, or one per line), when python3 is here
  command -v python3 >/dev/null || { echo "$1: python3 absent, JSON not parsed"; return; }
  if python3 -c 'import json, sys
t = sys.stdin.read()
[json.loads(l) for l in t.splitlines()] if sys.argv[1] == "lines" else json.loads(t)' "${3:-doc}" <<<"$2"; then ok
  else fail "$1: not valid JSON"; fi
}
clean_env() { env -u LLMKERN_USE_FUSED -u VEOMNI_USE_LIGER_KERNEL -u LLMKERN_BACKEND -u MODELING_BACKEND \
  -u LLMKERN_ENABLE_CHUNK_LOSS -u VEOMNI_ENABLE_CHUNK_LOSS -u LLMKERN_USE_GROUP_GEMM -u USE_GROUP_GEMM "$@"; }

# --- list and explain: 120 columns, no trailing spaces, shared reasons once -----------------
out=$("$bin" list); rc=$?
[ $rc -eq 0 ] && ok || fail "list exit $rc"
fits "list" "$out"
expect "list: what runs here" "$out" '^runs here \([0-9]+\):$'
expect "list: the unbuilt names in their own section" "$out" '^not in this build \([0-9]+\), names the design gives:$'
expect "list: unbuilt flash_attention_4" "$out" '^  attention +flash_attention_4 +a Blackwell GPU'
expect "list: NeMo names" "$out" "^NeMo AutoModel's names llmkern implements \([0-9]+\)"
expect "list: NeMo unimplemented" "$out" "^  moe_dispatch +deepep +alltoall +DeepEP's dispatch and combine$"
absent "list: no reason after a summary" "$out" ' -- '
# every reason a row gives is said once, as its section's heading (on a CUDA build without a
# GPU: the CUDA rows' "needs a CUDA GPU (...)"), and the JSON has the same rows
json=$("$bin" list --json)
json_ok "list --json" "$json"
n_cuda=$(grep -c '"device": "cuda", "available": false' <<<"$json")
if [ "$n_cuda" -gt 1 ]; then
  why=$(grep -m1 -oE '"device": "cuda", "available": false, "reason": "[^"]*"' <<<"$json" | sed 's/.*"reason": "//; s/"$//')
  [ "$(tr -s ' \n' '  ' <<<"$out" | grep -oF "$why" | wc -l)" -eq 1 ] && ok ||
    fail "list: '$why' ($n_cuda rows) is not said once"
  expect "list: its section" "$(tr -s ' \n' '  ' <<<"$out")" "does not run here: needs a CUDA GPU .* \($n_cuda\):"
fi
[ "$(grep -c '^  {"op"' <<<"$json")" -eq "$(grep -cE '^  [a-z_]+ +[a-z]' <<<"$out")" ] && ok ||
  fail "list: $(grep -c '^  {"op"' <<<"$json") JSON rows, $(grep -cE '^  [a-z_]+ +[a-z]' <<<"$out") text rows"

for dev in cpu cuda; do
  out=$(clean_env "$bin" explain --device $dev 2>&1)
  fits "explain --device $dev" "$out"
done
out=$(clean_env "$bin" explain --config "$src/configs/nemo-tiny-moe.yaml" 2>&1)
fits "explain --config configs/nemo-tiny-moe.yaml" "$out"
expect "explain: the bindings' table" "$out" '^OP +REQUESTED +IMPL +STAGE +SOURCE$'

# --- one JSON writer: escaping, and the same rows as before ----------------------------------
weird="$tmp/q\"b\\c"$'\t'"d"$'\xff'"e.yaml"
printf 'model:\n  ops_implementation:\n    rms_norm_implementation: eager\n' >"$weird"
out=$(clean_env "$bin" explain --json --config "$weird"); rc=$?
[ $rc -eq 0 ] && ok || fail "explain --config with quote, backslash, tab and 0xff in the name: exit $rc"
json_ok "explain --json, an odd file name" "$out"
expect "escaped source" "$out" '"source": "config [^"]*/q\\"b\\\\c\\td\\ufffde\.yaml:3:30"'
out=$(clean_env "$bin" explain --json)
json_ok "explain --json" "$out"
expect "explain row" "$out" '^  \{"op": "attention", "module": "", "requested": "flash_attention_2", "source": "default built-in", "resolved": "[a-z_0-9]+", "impl": "[a-z_0-9]+", "stage": "[a-z_]+", "fallback": ""\},$'
out=$("$bin" check --op rope --impl fused --dtype f32 --json); rc=$?
[ $rc -eq 0 ] && ok || fail "check --json exit $rc"
json_ok "check --json" "$out"
expect "check row" "$out" '"op": "rope", "impl": "fused", "dtype": "f32", "shape": "[^"]+", "max_rel_err": [0-9.e+-]+, "tol": [0-9.e+-]+, "pass": true'
out=$("$bin" check --op rope --impl fused --dtype f32); rc=$?
fits "check" "$out"

# --- bench: named cases, every option checked before anything is timed ---------------------
bad() {  # bad NAME PATTERN ARGS...: exit 2, the message, no row, and no time spent on the ceilings
  local name=$1 re=$2; shift 2
  local t0 out rc ms
  t0=$(date +%s%N)
  out=$("$bin" bench "$@" 2>&1 >"$tmp/stdout"); rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  [ $rc -eq 2 ] && ok || fail "$name: exit $rc, expected 2"
  expect "$name" "$out" "$re"
  [ ! -s "$tmp/stdout" ] && ok || fail "$name: rows printed: $(head -3 "$tmp/stdout")"
  # the ceilings alone take 3 s (three timings of at least 1 s each): a refusal comes first,
  # in about the time the command needs to refuse an unknown --op (a CUDA build's start-up
  # probes the driver: a second on a busy machine)
  [ $ms -lt $((base_ms + 1500)) ] && ok || fail "$name: took $ms ms (start-up $base_ms ms): something was timed first"
}
base_ms=0
for k in 1 2; do
  t0=$(date +%s%N); "$bin" bench --op nonsense >/dev/null 2>&1; ms=$((($(date +%s%N) - t0) / 1000000))
  [ $ms -gt $base_ms ] && base_ms=$ms
done
A="--op attention --dtype f32 --size 1x8x256x32"
bad "--mask doc" "attention: --mask: expected one of none, causal, sliding, prefix_lm, document, got 'doc'" $A --mask doc
bad "--kv-heads 3" "attention: --kv-heads: expected a positive integer that divides the 8 query heads of --size, got '3'" \
  $A --kv-heads 3
bad "--kv-heads 0" "--kv-heads: expected a positive integer .*, got '0'" $A --kv-heads 0
bad "--kv-heads 2x" "--kv-heads: expected a positive integer .*, got '2x'" $A --kv-heads 2x
bad "--kv-heads -2" "--kv-heads: expected a positive integer .*, got '-2'" $A --kv-heads -2
bad "--block abc" "attention: --block: expected a positive integer of at most S = 256 \(the BlockMask's block size, such as 64 or 128\), got 'abc'" \
  $A --block abc
bad "--block 0" "--block: expected a positive integer .*, got '0'" $A --block 0
bad "--block 512" "--block: expected a positive integer of at most S = 256 .*, got '512'" $A --block 512
bad "the old 5th size field" "attention: --size: expected BxHxSxD \(4 dims such as 1x8x4096x64; the mask, KV heads and block size are --mask, --kv-heads, --block\), got 5 dims" \
  --op attention --size 1x8x256x32x4
bad "--size 1x8x0x32" "--size: expected positive integers joined by 'x' such as 8192x4096, got '1x8x0x32'" --op attention --size 1x8x0x32
bad "--mask for rms_norm" "--mask: expected an --op whose bench takes it \(attention\), got --op rms_norm" --op rms_norm --mask causal
bad "--block for rope" "--block: expected an --op whose bench takes it \(attention\), got --op rope" --op rope --block 64
bad "prefix_lm on sdpa" "--impl sdpa: attention: --mask prefix_lm needs a BlockMask: eager or flex_attention run it" \
  $A --impl sdpa --mask prefix_lm
bad "--impl nothing" "no implementation matched the options" --op attention --impl nothing
bad "a bad value of all ops" "attention: --size: expected BxHxSxD" --size 64x256

out=$("$bin" bench --op attention --impl flex_attention --dtype f32 --size 1x4x64x16 --mask document --kv-heads 2 \
      --block 16 --json); rc=$?
[ $rc -eq 0 ] && ok || fail "bench --mask document --kv-heads 2 --block 16: exit $rc"
json_ok "bench --json" "$out"
expect "bench json case" "$out" '"impl": "flex_attention", "device": "cpu", "dtype": "f32", "shape": "1x4x64x16", "mask": "document", "hkv": 2, "blk": 16, "density": [0-9.]+, "pass": "fwd\+bwd"'
out=$("$bin" bench --op attention --impl sdpa --dtype f32 --size 1x4x64x16 --mask sliding); rc=$?
[ $rc -eq 0 ] && ok || fail "bench --mask sliding: exit $rc"
expect "bench text case" "$out" '^attention +sdpa +cpu +f32 +1x4x64x16 +mask=sliding hkv=4 density=0\.[0-9]+ +fwd\+bwd +[0-9.]+'
absent "bench: no BlockMask, no blk" "$out" 'blk='
absent "bench: no trailing spaces" "$out" ' $'
out=$("$bin" bench --op attention --dtype f32 --size 1x2x64x16 --mask prefix_lm 2>"$tmp/err"); rc=$?
[ $rc -eq 0 ] && ok || fail "bench --mask prefix_lm over every row: exit $rc"
expect "prefix_lm: the rows that cannot, skipped with one note" "$(cat "$tmp/err")" \
  '^llmkern bench: skipped sdpa, flash_attention_2, llmkern_flash_attention_2_with_sp: attention: --mask prefix_lm needs a BlockMask'
expect "prefix_lm: flex runs it" "$out" '^attention +flex_attention +cpu +f32 +1x2x64x16 +mask=prefix_lm hkv=2 blk=128 '
absent "prefix_lm: sdpa not run" "$out" '^attention +sdpa '

# --- train --json: one object per step -------------------------------------------------------
cat >"$tmp/tiny.yaml" <<'YAML'
model: { hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16,
         intermediate_size: 64, vocab_size: 320, torch_dtype: float32 }
train: { steps: 3, batch_size: 2, seq_len: 16, save_every: 0, warmup_steps: 1 }
data: { corpus: builtin, docs: 16 }
YAML
out=$(OMP_NUM_THREADS=2 "$bin" train --config "$tmp/tiny.yaml" --out "$tmp/run" --json 2>"$tmp/err"); rc=$?
[ $rc -eq 0 ] && ok || fail "train --json: exit $rc: $(cat "$tmp/err")"
[ "$(wc -l <<<"$out")" -eq 3 ] && ok || fail "train --json: expected 3 lines (one a step), got: $out"
json_ok "train --json" "$out" lines
for k in 1 2 3; do
  expect "train --json step $k" "$(sed -n ${k}p <<<"$out")" \
    "^\{\"step\": $k, \"steps\": 3, \"loss\": [0-9.e+-]+, \"lr\": [0-9.e+-]+, \"grad_norm\": [0-9.e+-]+, \"tokens_per_s\": [0-9.]+, \"eta_s\": [0-9.]+\}$"
done
expect "train --json: the summary on stderr" "$(cat "$tmp/err")" '^done: steps 1\.\.3'

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
