"""test_transformers.py — llmkern inside Hugging Face transformers: the four attention
names registered and equal to transformers' own attention in a whole model (padding
masks, packed sequences, the flex BlockMask), apply_llmkern_kernel_to_qwen3 /
_qwen3_moe patching every module with the registry's choices (fields, overrides, the
environment) and explain() saying so, and a tiny random Qwen3 and Qwen3-MoE trained 20
steps patched and unpatched from the same weights: the same losses within f32 tolerance
on the CPU, bf16 tolerance on a GPU."""
import copy
import os

import pytest
import torch
from conftest import DEVICES, TOL, rel_err

import llmkern
import llmkern.transformers as lkt
from llmkern import LlmkernError
from transformers import AttentionInterface, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3 import modeling_qwen3 as mq
from transformers.models.qwen3_moe import modeling_qwen3_moe as mqm

HF_ROPE, HF_ROPE_MOE = mq.apply_rotary_pos_emb, mqm.apply_rotary_pos_emb


@pytest.fixture(autouse=True)
def _restore_rope():
    yield
    mq.apply_rotary_pos_emb, mqm.apply_rotary_pos_emb = HF_ROPE, HF_ROPE_MOE


def dense_config(**kw):
    c = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False,
             attention_dropout=0.0)
    c.update(kw)
    return Qwen3Config(**c)


def moe_config(**kw):
    c = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
             num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
             tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=0.01)
    c.update(kw)
    return Qwen3MoeConfig(**c)


def make(cls, cfg, attn="sdpa", device="cpu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg._attn_implementation = attn
    return cls(cfg).to(device, dtype)


def test_attention_names_are_registered():
    for name in ("llmkern_flash_attention_2", "llmkern_flash_attention_3", "llmkern_flex_attention",
                 "llmkern_cudnn"):
        assert name in AttentionInterface._global_mapping, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llmkern_flash_attention_2", "llmkern_flex_attention"])
@pytest.mark.parametrize("inputs", ["plain", "padded", "packed"])
def test_a_model_with_llmkern_attention_matches_sdpa(device, name, inputs):
    # flex_attention on CUDA takes bf16 alone (llmkern list): that model in bf16 against the f32
    # one, held to bf16's tolerance (the weights' rounding alone gives ~8e-3 here)
    bf16 = device == "cuda" and name == "llmkern_flex_attention"
    ref = make(Qwen3ForCausalLM, dense_config(), "sdpa", device)
    lk = copy.deepcopy(ref).to(torch.bfloat16 if bf16 else torch.float32)
    lk.config._attn_implementation = name
    ids = torch.randint(0, 128, (2, 12), device=device)
    kw = {}
    if inputs == "padded":
        mask = torch.ones(2, 12, dtype=torch.long, device=device)
        mask[1, 8:] = 0
        kw["attention_mask"] = mask
    if inputs == "packed":
        ids = ids[:1]
        kw["position_ids"] = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]], device=device)
        kw["use_cache"] = False            # transformers looks for packing only without a cache
    want, got = ref(ids, **kw).logits, lk(ids, **kw).logits.float()
    if inputs == "padded":
        want, got = want[kw["attention_mask"].bool()], got[kw["attention_mask"].bool()]
    if inputs == "packed":
        # transformers' sdpa runs the packed row as one causal sequence unless told; the
        # reference is each document alone
        docs = [(0, 5), (5, 8), (8, 12)]
        want = torch.cat([ref(ids[:, a:b]).logits for a, b in docs], 1)
    tol = TOL[torch.bfloat16] if bf16 else 1e-4
    assert rel_err(got, want) < tol, rel_err(got, want)


def test_registered_attention_refuses_what_it_cannot_run():
    m = make(Qwen3ForCausalLM, dense_config(), "llmkern_flash_attention_3")
    with pytest.raises(LlmkernError, match="flash_attention_3"):
        m(torch.randint(0, 128, (1, 8)))
    m.train()
    m.config.attention_dropout = 0.1
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = 0.1
    m.config._attn_implementation = "llmkern_flash_attention_2"
    with pytest.raises(ValueError, match="dropout"):
        m(torch.randint(0, 128, (1, 8)))


def _patched_modules(model):
    return {n for n, m in model.named_modules() if getattr(m, "_llmkern", None) or getattr(m, "_llmkern_rope", None)}


def test_apply_patches_every_module_and_explains_it(capsys):
    m = make(Qwen3ForCausalLM, dense_config())
    lkt.apply_llmkern_kernel_to_qwen3(m, overrides={"layers.0.mlp": {"swiglu_mlp_implementation": "eager"}},
                                      rms_norm_implementation="eager_fp32")
    names = _patched_modules(m)
    for want in ("model.norm", "model.layers.1.input_layernorm", "model.layers.0.self_attn.q_norm",
                 "model.layers.1.mlp", "model.layers.0.self_attn", ""):
        assert want in names, (want, sorted(names))
    text = llmkern.explain(m)
    assert "layers.0.mlp" in text and "override" in text
    line = [ln for ln in text.splitlines() if ln.startswith("layers.0.mlp ")][0]
    assert "eager/cpu" in line, line
    line = [ln for ln in text.splitlines() if ln.startswith("layers.1.mlp ")][0]
    assert "fused/cpu" in line, line
    line = [ln for ln in text.splitlines() if ln.startswith("norm ")][0]
    assert "eager_fp32/cpu" in line and "config" in line, line
    assert "rotary_emb" in text and "lm_head" in text
    out = m(torch.randint(0, 128, (1, 8)), labels=torch.randint(0, 128, (1, 8)))
    assert torch.isfinite(out.loss)


def test_apply_refuses_unknown_names_and_choices():
    m = make(Qwen3ForCausalLM, dense_config())
    with pytest.raises(LlmkernError, match="rms_norm"):
        lkt.apply_llmkern_kernel_to_qwen3(m, rms_norm="fussed")
    with pytest.raises(TypeError, match="unknown choice"):
        lkt.apply_llmkern_kernel_to_qwen3(m, rmsnorm=True)
    with pytest.raises(LlmkernError, match="layers.0.mlp"):
        lkt.apply_llmkern_kernel_to_qwen3(m, overrides={"layers.0.mlp": {"rms_norm_implementation": "eager"}})


def test_apply_follows_the_environment(monkeypatch):
    monkeypatch.setenv("LLMKERN_USE_FUSED", "0")
    m = make(Qwen3ForCausalLM, dense_config())
    lkt.apply_llmkern_kernel_to_qwen3(m)
    text = lkt.explain(m)
    line = [ln for ln in text.splitlines() if ln.startswith("norm ")][0]
    assert "LLMKERN_USE_FUSED=0" in line and "fused/cpu" not in line, line
    monkeypatch.setenv("LLMKERN_USE_FUSED", "maybe")
    with pytest.raises(LlmkernError, match="LLMKERN_USE_FUSED"):
        lkt.apply_llmkern_kernel_to_qwen3(m)


def test_apply_to_the_classes_patches_models_made_afterwards():
    saved = {n: getattr(mq, n).forward for n in ("Qwen3RMSNorm", "Qwen3MLP", "Qwen3ForCausalLM")}
    try:
        lkt.apply_llmkern_kernel_to_qwen3()
        m = make(Qwen3ForCausalLM, dense_config())
        assert mq.Qwen3RMSNorm.forward is lkt._rms_forward and mq.Qwen3MLP.forward is lkt._mlp_forward
        out = m(torch.randint(0, 128, (1, 8)), labels=torch.randint(0, 128, (1, 8)))
        assert torch.isfinite(out.loss)
        text = lkt.explain(m)
        assert [ln for ln in text.splitlines() if ln.startswith("layers.1.mlp ") and "fused/cpu" in ln], text
    finally:
        for n, f in saved.items():
            setattr(getattr(mq, n), "forward", f)
            if hasattr(getattr(mq, n), "_llmkern"):
                delattr(getattr(mq, n), "_llmkern")


# --- 20 steps, patched and unpatched --------------------------------------------------

def train(model, batches, steps=20, lr=2e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for step in range(steps):
        ids = batches[step % len(batches)]
        out = model(ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
    return losses


FAMILIES = {"qwen3": (Qwen3ForCausalLM, dense_config, lkt.apply_llmkern_kernel_to_qwen3),
            "qwen3_moe": (Qwen3MoeForCausalLM, moe_config, lkt.apply_llmkern_kernel_to_qwen3_moe)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_model_trains_like_the_unpatched_one(device, family):
    cls, cfg, apply = FAMILIES[family]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    ref = make(cls, cfg(), "sdpa", device, dtype)
    lk = copy.deepcopy(ref)
    apply(lk)
    lk.config._attn_implementation = "llmkern_flash_attention_2"
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 128, (2, 32), generator=g).to(device) for _ in range(4)]
    want = train(ref, batches)
    got = train(lk, batches)
    print(f"{family} {device} {dtype}: unpatched {want[0]:.5f} -> {want[-1]:.5f}, "
          f"patched {got[0]:.5f} -> {got[-1]:.5f}")
    assert want[-1] < want[0] - 0.2, want                      # it learns
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for step, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= tol * abs(b), f"step {step}: patched {a} vs unpatched {b} (tol {tol})\n{got}\n{want}"
    if os.environ.get("LLMKERN_TEST_EXPLAIN"):
        llmkern.explain(lk)


def test_apply_reads_a_yaml_config(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model:\n  ops_implementation:\n    rms_norm_implementation: eager\n"
                   "    overrides:\n      \"layers.1.mlp\": { swiglu_mlp_implementation: eager }\n")
    m = make(Qwen3ForCausalLM, dense_config())
    lkt.apply_llmkern_kernel_to_qwen3(m, config=str(cfg))
    text = lkt.explain(m)
    line = [ln for ln in text.splitlines() if ln.startswith("norm ")][0]
    assert "eager/cpu" in line and "run.yaml:3" in line, line
    line = [ln for ln in text.splitlines() if ln.startswith("layers.1.mlp ")][0]
    assert "eager/cpu" in line and "override" in line, line
    # a choice given in the call is the op's field too: the call's value is what binds
    lkt.apply_llmkern_kernel_to_qwen3(m, config=str(cfg), rms_norm="eager_fp32")
    line = [ln for ln in lkt.explain(m).splitlines() if ln.startswith("norm ")][0]
    assert "eager_fp32/cpu" in line, line


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_auto_class_loads_and_patches_by_model_type(tmp_path, family):
    """from_pretrained: the checkpoint's model patched as apply patches it (the same logits, bit for
    bit), llmkern's choices taken out of the keyword arguments and transformers' passed on."""
    cls, cfg, apply = FAMILIES[family]
    ref = make(cls, cfg())
    ref.save_pretrained(tmp_path)
    yaml = tmp_path / "ops.yaml"
    yaml.write_text("model:\n  ops_implementation:\n    swiglu_mlp_implementation: eager\n")
    m = lkt.AutoLlmkernKernelForCausalLM.from_pretrained(tmp_path, rms_norm="eager_fp32", ops_config=str(yaml),
                                                         attn_implementation="llmkern_flash_attention_2")
    assert type(m) is cls and m._llmkern_patch.family == family
    assert m.config._attn_implementation == "llmkern_flash_attention_2"
    line = [ln for ln in lkt.explain(m).splitlines() if ln.startswith("norm ")][0]
    assert "eager_fp32/cpu" in line, line
    want = copy.deepcopy(ref)
    want.config._attn_implementation = "llmkern_flash_attention_2"
    apply(want, rms_norm="eager_fp32", config=str(yaml))
    ids = torch.randint(0, 128, (2, 10))
    assert torch.equal(m(ids).logits, want(ids).logits)
    assert not torch.equal(m(ids).logits, ref(ids).logits)          # not transformers' own modules
    bf = lkt.AutoLlmkernKernelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, swiglu=False)
    assert next(bf.parameters()).dtype == torch.bfloat16
    assert not hasattr(bf.model.layers[0].mlp, "_llmkern") and hasattr(bf.model.norm, "_llmkern")


def test_the_auto_class_from_config_and_its_refusals(tmp_path):
    m = lkt.AutoLlmkernKernelForCausalLM.from_config(moe_config(), experts="eager")
    assert type(m) is Qwen3MoeForCausalLM
    line = [ln for ln in lkt.explain(m).splitlines() if ln.startswith("layers.0.mlp.experts ")][0]
    assert "eager/cpu" in line, line
    from transformers import LlamaConfig
    LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2).save_pretrained(tmp_path)  # a config alone: refused before any weight
    with pytest.raises(ValueError, match="model_type: expected one of qwen3, qwen3_moe, got 'llama'"):
        lkt.AutoLlmkernKernelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="from_config: model_type"):
        lkt.AutoLlmkernKernelForCausalLM.from_config(LlamaConfig())
    with pytest.raises(LlmkernError, match="rms_norm"):
        lkt.AutoLlmkernKernelForCausalLM.from_config(dense_config(), rms_norm="fussed")


def test_the_fused_loss_takes_num_items_in_batch():
    ref = make(Qwen3ForCausalLM, dense_config())
    lk = copy.deepcopy(ref)
    lkt.apply_llmkern_kernel_to_qwen3(lk)
    ids = torch.randint(0, 128, (2, 16))
    labels = ids.clone()
    labels[0, :5] = -100
    for kw in ({}, {"num_items_in_batch": torch.tensor(40)}):
        want = ref(ids, labels=labels, **kw).loss
        got = lk(ids, labels=labels, **kw).loss
        assert abs(got.item() - want.item()) <= 1e-5 * abs(want.item()), (kw, got, want)


def test_flex_takes_a_torch_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask
    S = 24
    q, k, v = torch.randn(1, 4, S, 16), torch.randn(1, 2, S, 16), torch.randn(1, 2, S, 16)

    def window(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < 5)
    bm = create_block_mask(window, 1, None, S, S, device="cpu", _compile=False)
    fn = AttentionInterface._global_mapping["llmkern_flex_attention"]
    m = torch.nn.Module()
    m.is_causal = True
    out, _ = fn(m, q, k, v, bm)
    ref = llmkern.attention.attention(q, k, v, "flash_attention_2", window=(5, 5))
    assert rel_err(out, ref) < 1e-5
