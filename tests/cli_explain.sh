#!/usr/bin/env bash
# cli_explain.sh — the llmkern command as a user runs it: explain's sources under the
# environment variables (llmkern names and the described system's aliases), a config
# field beating them, a per-module override, the model's rope in the q/k norms (said or not),
# config errors with file:line; NeMo
# AutoModel's model.backend names shown as aliases, its unimplemented names refused.
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
expect "text override row" "$out" '^  layers\.0\.input_layernorm +rms_norm +eager_fp32 +eager_fp32 +config_finalize +override( |$)'

# q and k rotated by their norms (model.h lk_model_rope_in_norms): said under the table by
# default (fused norms and RoPE), not when the norms are eager
out=$(clean_env "$bin" explain)
expect "rope in the norms" "$out" '^q_norm and k_norm rotate q and k as they write them'
out=$(clean_env LLMKERN_USE_FUSED=0 "$bin" explain)
grep -q "rotate q and k as they write" <<<"$out" && fail "eager norms said to rotate" || ok

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

# NeMo AutoModel's model.backend: each name resolved per field and shown as an alias
moe_arch='  num_experts: 4
  num_experts_per_tok: 2
  moe_intermediate_size: 16
  hidden_size: 32
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 8
  intermediate_size: 48
  vocab_size: 320'
row() { grep -E "^\s*\{\"op\": \"$1\", \"module\": \"\"" <<<"$2"; }
nemo() {  # nemo FILE LINES...: a Qwen3-MoE config whose model.backend holds LINES
  local f=$1; shift
  { echo "model:"; echo "$moe_arch"; echo "  backend:"
    echo "    _target_: nemo_automodel.components.models.common.BackendConfig"
    for l in "$@"; do echo "    $l"; done; } >"$f"
}
nemo "$tmp/nemo.yaml" "attn: flex" "linear: torch" "rms_norm: torch_fp32" "rope: torch" "experts: torch_mm" \
  "dispatcher: torch" "fake_balanced_gate: true" "fake_gate_noise: 0.3" "gate_precision: float32"
out=$(clean_env "$bin" explain --json --config "$tmp/nemo.yaml"); rc=$?
[ $rc -eq 0 ] && ok || fail "nemo config exit $rc: $out"
for c in "attention|flex|flex_attention|llmkern_flex_attention_with_sp" "linear|torch|blas|blas" \
         "rms_norm|torch_fp32|eager_fp32|eager_fp32" "rope|torch|eager|eager" "moe_experts|torch_mm|fused|fused" \
         "moe_dispatch|torch|allgather|allgather"; do
  IFS='|' read -r op name as impl <<<"$c"
  expect "nemo $op $name" "$(row "$op" "$out")" \
    "\"requested\": \"$name\", \"source\": \"config $tmp/nemo.yaml:[0-9]+:[0-9]+ \(model.backend.[a-z_]+\); $name \(NeMo AutoModel\) = $as\", \"resolved\": \"$impl\", \"impl\": \"$impl\""
done
expect "nemo fake gate" "$(row moe_router "$out")" \
  "\"requested\": \"fake_balanced\", \"source\": \"config $tmp/nemo.yaml:[0-9]+:25 \(model.backend.fake_balanced_gate: true\); fake_gate_noise 0.3 at $tmp/nemo.yaml:[0-9]+:22 \(model.backend.fake_gate_noise\); gate_precision float32 at $tmp/nemo.yaml:[0-9]+:21 \(model.backend.gate_precision\)\".*\"impl\": \"fake_balanced\""
out=$(clean_env "$bin" explain --config "$tmp/nemo.yaml")
expect "nemo text row" "$out" '^rms_norm +torch_fp32 +eager_fp32 +config_finalize +config( |$)'
expect "nemo text source" "$(tr -s ' \n' '  ' <<<"$out")" \
  'rms_norm torch_fp32 eager_fp32 config_finalize config [^ ]*:[0-9]+:[0-9]+ \(model\.backend\.rms_norm\); torch_fp32 \(NeMo AutoModel\) = eager_fp32 rope '
nemo "$tmp/nemo2.yaml" "attn: eager" "experts: gmm" "rms_norm: torch" "rope_fusion: true" "gate_precision: torch.float32"
out=$(clean_env "$bin" explain --json --config "$tmp/nemo2.yaml")
expect "nemo eager is eager" "$(row attention "$out")" '"requested": "eager", .*"impl": "eager"'
expect "nemo gmm" "$(row moe_experts "$out")" '"requested": "gmm", .*; gmm \(NeMo AutoModel\) = fused", "resolved": "fused"'
expect "nemo rms torch" "$(row rms_norm "$out")" '; torch \(NeMo AutoModel\) = eager", "resolved": "eager"'
expect "nemo rope_fusion" "$(row rope "$out")" '"requested": "fused", "source": "config [^"]*\(model.backend.rope_fusion: true\)", "resolved": "fused"'
expect "nemo learned gate f32" "$(row moe_router "$out")" '"requested": "softmax_topk", "source": "default built-in; gate_precision float32 at [^"]*", .*"impl": "softmax_topk"'
nemo "$tmp/nemo3.yaml" "experts: torch"
expect "nemo experts torch" "$(row moe_experts "$(clean_env "$bin" explain --json --config "$tmp/nemo3.yaml")")" \
  '; torch \(NeMo AutoModel\) = eager", "resolved": "eager"'
out=$(clean_env "$bin" explain --json --config "$src/configs/nemo-tiny-moe.yaml"); rc=$?
[ $rc -eq 0 ] && ok || fail "configs/nemo-tiny-moe.yaml exit $rc"

# the NeMo names llmkern does not implement: refused, the nearest implementation named
for c in "attn te sdpa" "attn torch sdpa" "attn tilelang flex_attention" "attn fa4 flash_attention_2" \
         "attn magi flex_attention" "linear te blas" "linear quack blas" "rms_norm te fused" "rms_norm quack fused" \
         "rope quack fused" "rope triton fused" "experts te fused" "experts torch_mm_mxfp8 fused" \
         "dispatcher deepep alltoall" "dispatcher hybridep alltoall" "dispatcher uccl_ep alltoall" "dispatcher mok alltoall"; do
  read -r key name near <<<"$c"
  nemo "$tmp/no.yaml" "$key: $name"
  out=$(clean_env "$bin" explain --config "$tmp/no.yaml" 2>&1); rc=$?
  [ $rc -eq 2 ] && ok || fail "nemo $key: $name exit $rc"
  expect "nemo $key: $name refused" "$out" \
    "$tmp/no.yaml:[0-9]+:[0-9]+ \(model.backend.$key\): [a-z_.]+: '$name' \(NeMo AutoModel: [^)]+\)?\) is not available in llmkern; the nearest llmkern implementation is '$near'"
done
for c in "fake_gate_noise: 1.5|fake_gate_noise: expected a number in \[0, 1\], got '1.5'" \
         "fake_gate_noise: -1|fake_gate_noise: expected a number in \[0, 1\], got '-1'" \
         "fake_gate_noise: 0.5|fake_gate_noise: 0.5 is used only by the fake balanced router, but moe.router is 'softmax_topk'" \
         "gate_precision: bfloat16|gate_precision: expected float32" \
         "rms_norm: flex|rms_norm_implementation: unknown implementation 'flex'"; do
  IFS='|' read -r line msg <<<"$c"
  nemo "$tmp/bad-nemo.yaml" "$line"
  out=$(clean_env "$bin" explain --config "$tmp/bad-nemo.yaml" 2>&1); rc=$?
  [ $rc -eq 2 ] && ok || fail "nemo '$line' exit $rc"
  expect "nemo '$line' refused" "$out" "$tmp/bad-nemo.yaml:[0-9]+:[0-9]+ \(model.backend.[a-z_]+\): $msg"
done

out=$("$bin" list --json)
expect "list row" "$out" '"op": "rms_norm", "impl": "fused", "device": "cpu", "available": true'
expect "list nemo alias" "$out" '"op": "rms_norm", "impl": "torch_fp32", "device": "-", "available": true, "reason": "NeMo AutoModel.s name = eager_fp32"'
expect "list nemo by device" "$out" '"op": "linear", "impl": "torch", .*"reason": "NeMo AutoModel.s name = blas \(cpu\), cublaslt \(cuda\)"'
expect "list nemo unimplemented" "$out" '"op": "moe_dispatch", "impl": "deepep", "device": "-", "available": false, "reason": "NeMo AutoModel.s name \(DeepEP.s dispatch and combine\): not available in llmkern; nearest alltoall"'
expect "list unbuilt" "$out" '"op": "attention", "impl": "flash_attention_4", "device": "-", "available": false, "reason": "[^"]*not available in this build"'

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
