#!/usr/bin/env python3
"""hf_compare.py — llmkern's checkpoints against the Hugging Face reference implementations
(issue 22, item 3), nothing downloaded:

0. with the reference `safetensors` package (and numpy): llmkern's sharded output
   (train.max_shard_size 50KB) read shard by shard by safetensors itself, agreeing with
   its index (names per shard, metadata.total_size, format "pt"); then re-saved by
   safetensors in transformers' layout with another shard count, which `llmkern train
   --init` reads to the same step-1 loss;
with torch and transformers, for a tiny Qwen3 and a tiny Qwen3-MoE built by transformers, each
also with sliding-window attention (use_sliding_window, window 4 over 64 tokens: Qwen3's
layer 1, every Qwen3-MoE layer; the window is checked to change transformers' loss):
1. transformers writes the model sharded (save_pretrained, max_shard_size 50KB);
   `llmkern train --init` of that directory (steps 1, lr 0) logs a step-1 loss equal to
   transformers' loss on the same 64 tokens;
2. llmkern's own output directory (sharded too) loads in
   AutoModelForCausalLM.from_pretrained, its weights equal to transformers' bit for bit
   (lr 0 changes nothing) and its loss the same.

Run: python3 tests/hf_compare.py build/llmkern   (tests/cli_hf_compare.sh; ctest -R hf_compare)
Exit 0 pass, 1 a mismatch, 77 (skipped) when neither safetensors + numpy nor torch +
transformers can be imported; with only the first, part 0 runs and the rest is skipped
(said so).
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy
    import safetensors.numpy
    from safetensors import safe_open
    HAVE_ST = True
except ImportError:
    HAVE_ST = False
try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    HAVE_HF = True
except ImportError as e:
    HAVE_HF = False
    WHY_HF = e.name or str(e)
if not HAVE_ST and not HAVE_HF:
    print("hf_compare: skipped: neither safetensors + numpy nor torch + transformers is importable "
          "(pip install safetensors numpy torch transformers to run it)")
    sys.exit(77)

SEQ = 64
VOCAB = 320


def configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=0.2, tie_word_embeddings=False)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
               decoder_sparse_step=1, mlp_only_layers=[])
    for tag, slide in (("", {}), (" sliding", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1))):
        yield "Qwen3" + tag, transformers.Qwen3Config(**common, **slide)
        yield "Qwen3-MoE" + tag, transformers.Qwen3MoeConfig(**common, **moe, **slide)


TINY = """model: { hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
         intermediate_size: 128, vocab_size: 320, num_experts: 4, num_experts_per_tok: 2,
         moe_intermediate_size: 32, torch_dtype: float32, initializer_range: 0.2 }
train: { steps: 1, batch_size: 1, seq_len: 64, max_shard_size: 50KB }
data: { tokens: tokens.lktok, eos_id: -1 }
"""


def reference_safetensors(bin_, tmp):
    """Part 0: llmkern's shards through the reference reader, and the reference writer's back."""
    cfg = os.path.join(tmp, "tiny.yaml")
    with open(cfg, "w") as f:
        f.write(TINY)
    out = os.path.join(tmp, "lk-out")
    r = subprocess.run([bin_, "train", "--config", cfg, "--out", out], capture_output=True, text=True)
    if r.returncode:
        print(r.stdout + r.stderr)
        return False
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    total, ok = 0, True
    tensors = {}
    for name in files:
        arrays = safetensors.numpy.load_file(os.path.join(out, name))
        with safe_open(os.path.join(out, name), framework="numpy") as h:
            ok &= (h.metadata() or {}).get("format") == "pt"
        ok &= set(arrays) == {k for k, v in index["weight_map"].items() if v == name}
        total += sum(a.nbytes for a in arrays.values())
        tensors.update(arrays)
    ok &= total == index["metadata"]["total_size"] and len(files) >= 3
    print(f"safetensors {safetensors.__version__}: llmkern's {len(files)} shards, {len(tensors)} tensors, "
          f"{total} bytes = the index's total_size, format pt: {'OK' if ok else 'FAIL'}")
    # the reference writer, transformers' layout: one shard per 4 tensors, sorted names in the index
    ref = os.path.join(tmp, "ref")
    os.makedirs(ref)
    shutil.copy(os.path.join(out, "config.json"), ref)
    names = list(tensors)
    groups = [names[i:i + 4] for i in range(0, len(names), 4)]
    wmap = {}
    for k, g in enumerate(groups):
        fn = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        safetensors.numpy.save_file({n: tensors[n] for n in g}, os.path.join(ref, fn), metadata={"format": "pt"})
        wmap.update({n: fn for n in g})
    with open(os.path.join(ref, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2, sort_keys=True)
        f.write("\n")
    a = llmkern_step1(bin_, tmp, out, os.path.join(tmp, "from-lk"))
    b = llmkern_step1(bin_, tmp, ref, os.path.join(tmp, "from-ref"))
    same = a == b
    print(f"llmkern --init of its own shards: step-1 loss {a:.7f}; of the reference writer's {len(groups)} shards: "
          f"{b:.7f}: {'OK' if same else 'FAIL'}")
    return ok and same


def hf_loss(model, ids):
    with torch.no_grad():
        return model(input_ids=ids[None], labels=ids[None]).loss.item()


def llmkern_step1(bin_, tmp, init, out):
    cfg = os.path.join(tmp, "run.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {{ init_from: {init}, torch_dtype: float32 }}\n"
                f"train: {{ steps: 1, lr: 0, min_lr: 0, warmup_steps: 0, weight_decay: 0, batch_size: 1,\n"
                f"         seq_len: {SEQ}, max_shard_size: 50KB }}\n"
                f"data: {{ tokens: tokens.lktok, eos_id: -1 }}\n")
    r = subprocess.run([bin_, "train", "--config", cfg, "--out", out], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        sys.exit(1)
    with open(os.path.join(out, "loss.csv")) as f:
        return float(f.read().splitlines()[1].split(",")[1])


def main():
    bin_ = sys.argv[1] if len(sys.argv) > 1 else "build/llmkern"
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        x, toks = 12345, []
        for _ in range(SEQ):   # a fixed pseudo-random sequence (an LCG), the same for every part
            x = (x * 1103515245 + 12345) % (1 << 31)
            toks.append(x % VOCAB)
        with open(os.path.join(tmp, "tokens.lktok"), "wb") as f:   # LKTOK version 1: one document
            f.write(b"LKTOK" + bytes([1, 2, 0]) + struct.pack("<Q", SEQ) + struct.pack(f"<{SEQ}H", *toks))
        if HAVE_ST:
            ok &= reference_safetensors(bin_, tmp)
        else:
            print("hf_compare: part 0 skipped: safetensors + numpy not importable")
        if not HAVE_HF:
            print(f"hf_compare: parts 1-2 (transformers) skipped: {WHY_HF} is not importable")
            sys.exit(0 if ok else 1)
        ids = torch.tensor(toks)
        for name, cfg in configs():
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
            hf_dir = os.path.join(tmp, f"hf-{name}")
            model.save_pretrained(hf_dir, max_shard_size="50KB", safe_serialization=True)
            shards = [f for f in os.listdir(hf_dir) if f.startswith("model-")]
            want = hf_loss(model, ids)
            if cfg.use_sliding_window:   # the window must move the loss by 5x the comparison's tolerance
                full_cfg = type(cfg)(**{**cfg.to_dict(), "use_sliding_window": False, "layer_types": None})
                full = AutoModelForCausalLM.from_config(full_cfg, attn_implementation="eager").float().eval()
                full.load_state_dict(model.state_dict())
                want_full = hf_loss(full, ids)
                binds = abs(want_full - want) > 5e-4 * abs(want)
                print(f"{name}: transformers' loss with the window {want:.6f}, without {want_full:.6f}: "
                      f"{'binds' if binds else 'FAIL: the window changes nothing'}")
                ok &= binds
            out = os.path.join(tmp, f"out-{name}")
            got = llmkern_step1(bin_, tmp, hf_dir, out)
            same = abs(got - want) <= 1e-4 * abs(want)
            print(f"{name}: transformers' sharded save ({len(shards)} shards) -> llmkern --init: step-1 loss "
                  f"{got:.6f}, transformers {want:.6f}: {'OK' if same else 'FAIL'}")
            ok &= same
            dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
            back = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", **dtype).eval()
            a, b = model.state_dict(), back.state_dict()
            diff = max((a[k] - b[k]).abs().max().item() for k in a)
            loss_back = hf_loss(back, ids)
            shards = [f for f in os.listdir(out) if f.startswith("model-")]
            same = set(a) == set(b) and diff == 0 and abs(loss_back - want) <= 1e-6 * abs(want)
            print(f"{name}: llmkern's sharded output ({len(shards)} shards) -> from_pretrained: {len(b)} tensors, "
                  f"max |diff| {diff:g}, loss {loss_back:.6f}: {'OK' if same else 'FAIL'}")
            ok &= same and math.isfinite(loss_back)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
