#!/usr/bin/env python3
"""hf_patch_h200.py — a Hugging Face Qwen3 trained with llmkern's patch against the same
model with Liger-Kernel's (issue 23, "what must be shown"): the same random weights and
random tokens, bf16, fused AdamW, N steps each; tokens/s (median step after warm-up),
peak memory, and both loss curves. PEERS-H200.md's dense end-to-end config by default
(28 layers, hidden 1024, vocab 151936, seq 4096 x batch 8).

  llmkern: apply_llmkern_kernel_to_qwen3(model) + attn_implementation llmkern_flash_attention_3
           (llmkern_flash_attention_2 below sm_90; --attn to choose)
  liger:   apply_liger_kernel_to_qwen3(model=model) + sdpa
  hf:      nothing patched, sdpa (--runs hf,liger,llmkern; plain HF does not fit at 4096 x 8)

Run (the H200, after tests/cuda/run_h200.sh built BUILD):
  PYTHONPATH=BUILD/python python3 bench/hf_patch_h200.py --out $OUT      # writes OUT/hf_patch.md, hf_patch_loss.csv
Check it on the CPU, tiny:  PYTHONPATH=build/python python3 bench/hf_patch_h200.py --tiny --device cpu
"""
import argparse
import copy
import os
import statistics
import time

import torch

P = argparse.ArgumentParser()
P.add_argument("--steps", type=int, default=50)
P.add_argument("--warmup", type=int, default=5, help="steps left out of tokens/s")
P.add_argument("--seq", type=int, default=4096)
P.add_argument("--batch", type=int, default=8)
P.add_argument("--runs", default="llmkern,liger")
P.add_argument("--attn", default=None, help="llmkern's attention name (default: by the GPU)")
P.add_argument("--device", default="cuda")
P.add_argument("--tiny", action="store_true", help="a 2-layer model, seq 64 x 2 (checks the script)")
P.add_argument("--out", default=os.environ.get("OUT", "."))
A = P.parse_args()

import llmkern  # noqa: E402  (torch first: llmkern/__init__ says why)
import llmkern.transformers as lkt  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

dev = torch.device(A.device)
dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
if A.tiny:
    cfg = Qwen3Config(vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=True)
    A.seq, A.batch = min(A.seq, 64), min(A.batch, 2)
else:   # Qwen3-0.6B's shape (PEERS-H200.md)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
cfg.use_cache = False
attn = A.attn or ("llmkern_flash_attention_3" if dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
                  else "llmkern_flash_attention_2")

torch.manual_seed(0)
cfg._attn_implementation = "sdpa"
base = Qwen3ForCausalLM(cfg).to(dtype)
state = copy.deepcopy(base.state_dict())
del base
g = torch.Generator().manual_seed(1)
batches = [torch.randint(0, cfg.vocab_size, (A.batch, A.seq), generator=g) for _ in range(4)]
n_params = sum(v.numel() for k, v in state.items() if "lm_head" not in k)


def flops_per_token():
    """PEERS-H200.md's count: 6 x matmul parameters (the tied embedding counted once, as
    the LM head) + 6 x layers x seq x heads x head_dim."""
    L, H, D = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim
    return 6 * n_params + 6 * L * A.seq * H * D


def run(kind):
    c = copy.deepcopy(cfg)
    c._attn_implementation = attn if kind == "llmkern" else "sdpa"
    m = Qwen3ForCausalLM(c).to(dtype)
    m.load_state_dict(state)
    m = m.to(dev)
    if kind == "llmkern":
        lkt.apply_llmkern_kernel_to_qwen3(m)
        llmkern.explain(m)
    elif kind == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3
        apply_liger_kernel_to_qwen3(model=m)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=dev.type == "cuda")
    m.train()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    losses, times = [], []
    for step in range(A.steps):
        ids = batches[step % len(batches)].to(dev, non_blocking=True)
        t0 = time.perf_counter()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
    dt = statistics.median(times[A.warmup:] or times)
    tps = A.batch * A.seq / dt
    del m, opt
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return dict(kind=kind, tps=tps, peak=peak, losses=losses, ms=dt * 1e3)


rows = []
for kind in A.runs.split(","):
    try:
        r = run(kind)
    except torch.cuda.OutOfMemoryError as e:  # plain HF at the full shape
        r = dict(kind=kind, error=f"out of memory: {str(e).splitlines()[0]}")
    except Exception as e:  # noqa: BLE001 - a run that cannot start is a row that says why
        r = dict(kind=kind, error=f"{type(e).__name__}: {e}")
    rows.append(r)
    print(kind, {k: v for k, v in r.items() if k != "losses"}, flush=True)

os.makedirs(A.out, exist_ok=True)
peak_tf = 989e12
name = "Qwen3 tiny" if A.tiny else "Qwen3 dense 28 layers, hidden 1024, vocab 151936"
lines = [f"# {name}, seq {A.seq} x batch {A.batch}, {str(dtype).replace('torch.', '')}, {A.steps} steps, "
         f"same weights and tokens ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}, "
         f"torch {torch.__version__})", "",
         "| run | attention | tokens/s | ms/step | MFU of 989 TF | peak GiB | loss step 1 | loss last |",
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    if "error" in r:
        lines.append(f"| {r['kind']} | | {r['error']} | | | | | |")
        continue
    mfu = r["tps"] * flops_per_token() / peak_tf * 100
    lines.append(f"| {r['kind']} | {attn if r['kind'] == 'llmkern' else 'sdpa'} | {r['tps']:,.0f} | {r['ms']:.1f} | "
                 f"{mfu:.1f}% | {r['peak']:.1f} | {r['losses'][0]:.4f} | {r['losses'][-1]:.4f} |")
ok = [r for r in rows if "losses" in r]
if len(ok) >= 2:
    d = max(abs(a - b) / abs(b) for a, b in zip(ok[0]["losses"], ok[1]["losses"]))
    lines += ["", f"largest relative difference of the loss curves ({ok[0]['kind']} vs {ok[1]['kind']}): {d:.3g}"]
text = "\n".join(lines) + "\n"
print(text)
open(os.path.join(A.out, "hf_patch.md"), "w").write(text)
with open(os.path.join(A.out, "hf_patch_loss.csv"), "w") as f:
    f.write("step," + ",".join(r["kind"] for r in ok) + "\n")
    for i in range(A.steps):
        f.write(f"{i + 1}," + ",".join(f"{r['losses'][i]:.6f}" for r in ok) + "\n")
