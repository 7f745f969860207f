#!/usr/bin/env bash
# cli_explain.sh — the llmkern command as a user runs it: explain's sources under the
# environment variables (llmkern names and the described system's aliases), a config
# field beating them, a per-module override, and config errors with file:line.
# Run: bash tests/cli_explain.sh build/llmkern .
set -u
bin=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() {  # expect NAME TEXT PATTERN: PATTERN (grep -E) must occur in TEXT
  if grep -qE -- "$3" <<<"$2"; then ok; else fail "$1: /$3/ not in:"; echo "$2" | head -20; fi
}
clean_env() { env -u LLMKERN_USE_FUSED -u VEOMNI_USE_LIGER_KERNEL -u LLMKERN_BACKEND -u MODELING_BACKEND \
  -u LLMKERN_ENABLE_CHUNK_LOSS -u VEOMNI_ENABLE_CHUNK_LOSS -u LLMKERN_USE_GROUP_GEMM -u USE_GROUP_GEMM "$@"; }
rms_row() { grep -E '^\s*\{"op": "rms_norm", "module": ""' <<<"$1"; }

out=$(clean_env LLMKERN_USE_FUSED=0 "$bin" explain --json)
expect "LLMKERN_USE_FUSED=0" "$(rms_row "$out")" '"source": "env LLMKERN_USE_FUSED=0".*"impl": "eager"'
out=$(clean_env VEOMNI_USE_LIGER_KERNEL=0 "$bin" explain --json)
expect "VEOMNI_USE_LIGER_KERNEL=0" "$(rms_row "$out")" '"source": "env VEOMNI_USE_LIGER_KERNEL=0".*"impl": "eager"'
expect "model_register stage" "$(rms_row "$out")" '"stage": "model_register"'
out=$(clean_env "$bin" explain --json)
expect "default" "$(rms_row "$out")" '"source": "default built-in".*"impl": "fused"'

cat >"$tmp/cfg.yaml" <<'YAML'
model:
  ops_implementation:
    rms_norm_implementation: fused
    overrides:
      "layers.0.input_layernorm": { rms_norm_implementation: eager_fp32 }
YAML
for var in LLMKERN_USE_FUSED VEOMNI_USE_LIGER_KERNEL; do
  out=$(clean_env $var=0 "$bin" explain --json --config "$tmp/cfg.yaml")
  expect "field beats $var" "$(rms_row "$out")" "\"source\": \"config $tmp/cfg.yaml:3:30\".*\"impl\": \"fused\".*\"stage\": \"config_finalize\""
  expect "override shows ($var)" "$out" "\"module\": \"layers.0.input_layernorm\".*\"source\": \"override $tmp/cfg.yaml:5:62\".*\"impl\": \"eager_fp32\""
done
out=$(clean_env "$bin" explain --config "$tmp/cfg.yaml")
expect "text override row" "$out" 'rms_norm @ layers.0.input_layernorm +eager_fp32'

printf 'model:\n  ops_implementation:\n    rms_norm_implementation: fusde\n' >"$tmp/bad.yaml"
out=$(clean_env "$bin" explain --config "$tmp/bad.yaml" 2>&1); rc=$?
[ $rc -ne 0 ] && ok || fail "unknown implementation exits 0"
expect "unknown impl message" "$out" "$tmp/bad.yaml:3:30: rms_norm_implementation: unknown implementation 'fusde' \(did you mean 'fused'\?\); valid: eager, eager_fp32, fused"

printf 'model:\n  ops_implementation: [\n' >"$tmp/malformed.yaml"
out=$(clean_env "$bin" explain --config "$tmp/malformed.yaml" 2>&1); rc=$?
[ $rc -ne 0 ] && ok || fail "malformed YAML exits 0"
expect "malformed message" "$out" "$tmp/malformed.yaml:[0-9]+:[0-9]+: malformed YAML"

out=$(clean_env LLMKERN_USE_FUSED=maybe "$bin" explain 2>&1); rc=$?
[ $rc -ne 0 ] && ok || fail "bad env value exits 0"
expect "bad env message" "$out" "LLMKERN_USE_FUSED: expected one of 1, 0, got 'maybe'"

out=$("$bin" list --json)
expect "list row" "$out" '"op": "rms_norm", "impl": "fused", "device": "cpu", "available": true'
expect "list unbuilt" "$out" '"op": "attention", "impl": "flash_attention_3", "device": "-", "available": false, "reason": "not available in this build"'

out=$("$bin" check --op rms_norm --json); rc=$?
[ $rc -eq 0 ] && ok || fail "check exit $rc"
expect "check rows" "$out" '"op": "rms_norm", "impl": "fused", "dtype": "bf16".*"pass": true'
out=$("$bin" check --op nonsense 2>&1); rc=$?
[ $rc -eq 2 ] && ok || fail "check --op nonsense exit $rc"

out=$("$bin" bench --op rms_norm --impl fused --dtype f32 --size 64x256 --json); rc=$?
[ $rc -eq 0 ] && ok || fail "bench exit $rc"
expect "bench ceiling row" "$out" '"op": "ceiling", "impl": "(memcpy|stream_copy)"'
expect "bench fwd+bwd row" "$out" '"impl": "fused", "device": "cpu", "dtype": "f32", "shape": "64x256", "pass": "fwd\+bwd"'

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
