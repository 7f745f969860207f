#!/usr/bin/env python3
"""e2e_peers.py — issue 17, item 4 and "what must be shown": llmkern's trainer end to end
beside Hugging Face transformers (SDPA, bf16 weights, fused AdamW) with and without
Liger-Kernel, on PEERS-H200.md's two configs, in one run, from the same initial weights
(llmkern writes them as a Hugging Face checkpoint, `llmkern train --save-init`;
transformers loads that directory) and the same random tokens (an LKTOK file, one
document, so llmkern's rows are the file's consecutive seq-long slices, batch i % --batches).

  dense  Qwen3-0.6B's shape: 28 layers, hidden 1024, 16 q / 8 kv heads of 128, FFN 3072,
         vocab 151936, tied embeddings (596 M parameters); seq 4096 x batch 8
  moe    Qwen3-MoE 2B-A0.4B: 16 layers, hidden 1024, 16 q / 4 kv heads of 128, 64 experts
         top-8, expert FFN 512, vocab 151936, untied (PEERS-H200.md's 2007 M / 442 M active);
         seq 4096 x batch 4

llmkern runs twice, eager and with train.cuda_graph (the step captured once and replayed:
the step time with and without the graph); a run kind's +flags add train keys (llmkern+bf16m keeps
AdamW's moments in bf16, train.exp_avg_dtype / exp_avg_sq_dtype; +recompute sets train.recompute;
+keepqk train.keep_qk; +bf16w the weights in bf16 alone, train.main_params_dtype; +lean
train.lm_head_chunk_bytes 1.25GB; +bf16r the residual stream in bf16, as the bf16 transformers
model carries it, train.fp32_residual_connection false; +gemmtune sets LLMKERN_GEMM_TUNE=1 for the run,
cuBLASLt's offers timed at the power cap on each shape's first call).
Per run: tokens/s (median step after the warm-up); MFU = FLOPs/token x tokens/s / 989e12
(the H200's dense bf16 peak), and the fraction of the 790 TFLOP/s cuBLAS reaches here
(8192^3), FLOPs/token = 6 x active matmul parameters + 6 x layers x seq x heads x head_dim
(PEERS-H200.md); peak GPU memory: torch.cuda.max_memory_allocated for transformers,
llmkern's own print when it has one, and for every run the GPU's nvidia-smi memory.used
above idle, polled (context and allocator caches included: the one column both share);
llmkern / HF+Liger. Writes OUT/e2e_peers.md and OUT/e2e_peers.json. Each transformers run
is a child process (--worker): an out-of-memory stays in it, and Liger's patches of the
transformers modules do not reach the next run. llmkern runs `train.dtype: bf16`; a binary
that rejects the key runs without it, and the row says f32. Both sides train alike: AdamW
(0.9, 0.95, eps 1e-8, weight decay 0.1), lr 3e-4 with llmkern's warm-up + cosine to 3e-5,
gradients clipped to norm 1.0; llmkern reads its loss every step (train.log_every: 1).
--rounds N runs the kinds N times in turn and adds each kind's median over the rounds and the
ratio of the medians: one peer run is not enough where the peer itself moves by 8% between
calls (HF + Liger's MoE run: 70.7k-76.3k tokens/s in bench/NOTES.md's twenty-third session).

--parity: issue 17's loss parity. From the same weights on the same batches, --parity-steps
(200) of llmkern bf16 (also with bf16 AdamW moments) and f32 and of transformers in f32 and in
both its bf16s (autocast over f32 weights, as Trainer(bf16=True) trains, and bf16 weights, as the
throughput runs do; --parity-hf-bf16 amp|weights names the verdict's); prints the mean absolute loss difference of
each pair (OUT/e2e_parity.md, .json), averaged over --parity-repeats repetitions from other
initial weights and batches (1; transformers' own pair moves by ~10% between runs; repetition r
draws from seed r, from --parity-first on; --parity-kinds names the bf16-moment runs). A 4-layer dense
Qwen3 of the same width at seq 1024 x 4 unless --parity-layers / --parity-seq / --parity-batch.

Run (the H200; B = the build directory, after `source tests/cuda/h200_env.sh`, Liger's
carried wheel on PYTHONPATH):
  PYTHONUNBUFFERED=1 python3 bench/e2e_peers.py --llmkern $B/llmkern --out $OUT           # < 8 min
  PYTHONUNBUFFERED=1 python3 bench/e2e_peers.py --llmkern $B/llmkern --out $OUT --parity  # ~2 min
Check it on the CPU, tiny (a minute; llmkern f32 there, Liger skipped without its wheel):
  python3 bench/e2e_peers.py --tiny --device cpu --lk-dtype f32 --llmkern build/llmkern --out /tmp/e2e
  python3 bench/e2e_peers.py --tiny --device cpu --parity --llmkern build/llmkern --out /tmp/e2e
"""
import argparse
import array
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PEAK_TF, CUBLAS_TF = 989e12, 790e12
LR, MIN_LR, WD, BETAS, EPS, CLIP = 3e-4, 3e-5, 0.1, (0.9, 0.95), 1e-8, 1.0

DENSE = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000,
             max_position_embeddings=40960)
MOE = dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
           intermediate_size=3072, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512,
           norm_topk_prob=True, vocab_size=151936, tie_word_embeddings=False, rope_theta=1000000,
           max_position_embeddings=40960)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=192, vocab_size=1024, tie_word_embeddings=True, rope_theta=1000000)
TINY_MOE = dict(TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                tie_word_embeddings=False)


def lr_at(step, warmup, total):
    """lk_lr_schedule (src/train/adamw.c): linear warm-up, then cosine to MIN_LR."""
    if step < warmup:
        return LR * (step + 1) / warmup
    span = total - warmup
    if span <= 1:
        return LR
    import math
    p = min(1.0, (step - warmup) / (span - 1))
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * p))


# --- the transformers side: one child process per run ---------------------------------

def worker(spec):
    """Trains spec's run and writes its result JSON (losses, step times, memory)."""
    import torch
    import transformers
    res = dict(torch=torch.__version__, transformers=transformers.__version__)
    dev = torch.device(spec["device"])
    if spec["kind"] == "liger":
        try:
            import liger_kernel.transformers as lg
            from importlib.metadata import version
            try:
                res["liger"] = version("liger_kernel")
            except Exception:  # noqa: BLE001 - a wheel on PYTHONPATH may lack its metadata
                res["liger"] = "?"
        except Exception as e:  # noqa: BLE001 - any import failure: the row says why
            res["skip"] = f"liger-kernel not importable: {type(e).__name__}: {e}"
            return res
    from transformers import AutoModelForCausalLM
    B, S = spec["batch"], spec["seq"]
    raw = open(spec["tokens"], "rb").read()
    ids = torch.frombuffer(bytearray(raw[32:]), dtype=torch.int32).long().view(-1, B, S)
    amp = spec["dtype"] == "amp"   # autocast bf16 over f32 weights
    wdtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    try:
        m = AutoModelForCausalLM.from_pretrained(spec["ckpt"], dtype=wdtype, attn_implementation="sdpa").to(dev)
        m.config.use_cache = False
        if spec["kind"] == "liger":
            moe = getattr(m.config, "num_experts", 0)
            (lg.apply_liger_kernel_to_qwen3_moe if moe else lg.apply_liger_kernel_to_qwen3)(model=m)
        opt = torch.optim.AdamW(m.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                fused=dev.type == "cuda")
        m.train()
        cuda = dev.type == "cuda"
        if cuda:
            res["gpu"] = torch.cuda.get_device_name(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        losses, times = [], []
        for step in range(spec["steps"]):
            x = ids[step % len(ids)].to(dev, non_blocking=True)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, spec["lr_warmup"], spec["steps"])
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = m(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            if (step + 1) % spec["say_every"] == 0 or step + 1 == spec["steps"]:
                print(f"    {spec['label']}: step {step + 1}/{spec['steps']} loss {losses[-1]:.4f} "
                      f"{B * S / times[-1]:,.0f} tok/s", flush=True)
        res.update(losses=losses, times=times)
        if cuda:
            res["alloc_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
            res["reserved_gib"] = torch.cuda.max_memory_reserved(dev) / 2**30
    except torch.cuda.OutOfMemoryError as e:   # plain HF at dense 4096 x 8: fp32 logits
        res["error"] = "out of memory: " + str(e).splitlines()[0][:160]
    return res


# --- what the parent runs --------------------------------------------------------------

# nvidia-smi's clock event (throttle) reasons, the bits of clocks_event_reasons.active
EVENT_REASONS = ((0x4, "SwPowerCap"), (0x8, "HwSlowdown"), (0x20, "SwThermal"), (0x40, "HwThermal"),
                 (0x80, "HwPowerBrake"), (0x2, "AppClocks"), (0x10, "SyncBoost"))


class GpuMem(threading.Thread):
    """The GPU's nvidia-smi memory.used, polled, less what it was before the child started; and
    the SM clock, power draw, temperature and clock event reasons of the samples where the GPU
    was busy (utilization >= 90%): whether a long run holds its clocks, and if not, why (a step
    at the 700 W cap runs slower than ncu's one-kernel-at-a-time sum; bench/NOTES.md asked
    which limit held llmkern's MoE run at ~1,720 MHz and ~630 W). The optional fields are
    probed once: a driver that lacks one still gives the others."""

    BASE = ["memory.used", "utilization.gpu", "clocks.sm", "power.draw"]

    def __init__(self, on):
        super().__init__(daemon=True)
        self.idx = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        self.on, self.peak, self.done = on and shutil.which("nvidia-smi") is not None, None, threading.Event()
        self.busy = []   # (SM MHz, W, degrees C or None, reasons bitmask or None) of the busy samples
        self.fields = list(self.BASE)
        if self.on:   # the first of each group the driver answers (the reasons' field was renamed)
            for group in (["temperature.gpu"], ["clocks_event_reasons.active", "clocks_throttle_reasons.active"]):
                for f in group:
                    if self.query([f]) is not None:
                        self.fields.append(f)
                        break
        first = self.read() if self.on else None
        self.base = first[0] if first else None

    def query(self, fields):
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                  "-i", self.idx], capture_output=True, text=True, timeout=10)
            vals = [x.strip() for x in out.stdout.split(",")]
            if out.returncode != 0 or len(vals) != len(fields):
                return None
            return [int(v, 16) if v.startswith("0x") else float(v) for v in vals]
        except Exception:  # noqa: BLE001 - no reading: no column
            return None

    def read(self):
        """MiB, %, MHz, W, then the optional fields (temperature C, reasons) or None each."""
        v = self.query(self.fields)
        if v is None:
            return None
        opt = dict(zip(self.fields[4:], v[4:]))
        return v[:4] + [opt.get("temperature.gpu"),
                        opt.get("clocks_event_reasons.active", opt.get("clocks_throttle_reasons.active"))]

    def run(self):
        while self.on and not self.done.wait(0.2):
            v = self.read()
            if v is not None and self.base is not None:
                self.peak = max(self.peak or 0.0, v[0] - self.base)
                if v[1] >= 90:
                    self.busy.append((v[2], v[3], v[4], v[5]))

    def stop(self):
        self.done.set()
        if self.on:
            self.join()
        return None if self.peak is None else self.peak / 1024   # GiB

    def clocks(self):
        """Median SM MHz and W over the busy samples, their count, the median temperature (None
        when not read) and the share of them each clock event reason held (None when not read);
        None when there were none."""
        if not self.busy:
            return None
        temps = [t for _, _, t, _ in self.busy if t is not None]
        reasons = [r for _, _, _, r in self.busy if r is not None]
        held = {name: sum(1 for r in reasons if r & bit) / len(reasons)
                for bit, name in EVENT_REASONS if any(r & bit for r in reasons)} if reasons else None
        return (statistics.median(c for c, _, _, _ in self.busy), statistics.median(w for _, w, _, _ in self.busy),
                len(self.busy), statistics.median(temps) if temps else None, held)


def clocks_text(c):
    """'1,720 MHz, 630 W (6), 71 C, SwPowerCap 100%' from GpuMem.clocks()."""
    mhz, watts, n, temp, held = c
    t = f"{mhz:,.0f} MHz, {watts:.0f} W ({n})"
    if temp is not None:
        t += f", {temp:.0f} C"
    if held is not None:
        t += ", " + (", ".join(f"{k} {v:.0%}" for k, v in held.items()) or "no clock event reason")
    return t


def write_tokens(path, vocab, n, seed):
    """An LKTOK version-2 file (include/llmkern/data.h) of n random ids, EOS -1 (one document)."""
    r = random.Random(seed)
    a = array.array("I", (r.randrange(vocab) for _ in range(n)))
    assert a.itemsize == 4 and sys.byteorder == "little"
    with open(path, "wb") as f:
        f.write(b"LKTOK" + bytes([2, 4, 0]) + n.to_bytes(8, "little") + vocab.to_bytes(8, "little")
                + (-1).to_bytes(8, "little", signed=True))
        a.tofile(f)


def yaml_of(sections):
    lines = []
    for sec, kv in sections.items():
        lines.append(f"{sec}:")
        for k, v in kv.items():
            v = str(v).lower() if isinstance(v, bool) else v
            lines.append(f"  {k}: {list(v) if isinstance(v, tuple) else v}")
    return "\n".join(lines) + "\n"


def flops_per_token(c, seq):
    """PEERS-H200.md: 6 x active matmul parameters (the LM head; the embedding is a lookup)
    + 6 x layers x seq x heads x head_dim. Also returns the total and active parameters."""
    h, L, H, K, D, V = (c[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "num_key_value_heads", "head_dim", "vocab_size"))
    attn = 2 * h * H * D + 2 * h * K * D
    E = c.get("num_experts") or 0
    ffn = h * E + c.get("num_experts_per_tok", 0) * 3 * h * c.get("moe_intermediate_size", 0) if E else \
        3 * h * c["intermediate_size"]
    ffn_all = h * E + E * 3 * h * c.get("moe_intermediate_size", 0) if E else ffn
    active = L * (attn + ffn) + V * h
    norms = L * (2 * h + 2 * D) + h
    total = L * (attn + ffn_all) + V * h * (1 if c.get("tie_word_embeddings") else 2) + norms
    return 6 * active + 6 * L * seq * H * D, total, active


def stream(cmd, timeout, on_line, env=None):
    """Runs cmd, each stdout line to on_line as it comes; killed after timeout s (rc -9).
    Returns (rc, stderr)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err = []
    te = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    te.start()
    killer = threading.Timer(timeout, p.kill)
    killer.start()
    for ln in p.stdout:
        on_line(ln)
    rc = p.wait()
    killer.cancel()
    te.join()
    return rc, "".join(err)


def run_hf(A, label, kind, dtype, ckpt, tokens, B, S, steps, work):
    spec = dict(label=label, kind=kind, dtype=dtype, device=A.device, ckpt=ckpt, tokens=tokens, batch=B, seq=S,
                steps=steps, lr_warmup=max(1, steps // 10), say_every=max(1, steps // 6))
    path = os.path.join(work, f"{label.replace(' ', '_')}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    mem = GpuMem(A.device == "cuda")
    mem.start()
    t0 = time.time()
    got = []

    def on(ln):
        if ln.startswith('{"result"'):
            got.append(json.loads(ln)["result"])
        else:
            print(ln, end="", flush=True)
    rc, err = stream([sys.executable, os.path.abspath(__file__), "--worker", path], A.run_timeout, on,
                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
    tail = (err.strip().splitlines() or [""])[-1][:200]
    r = got[0] if got else dict(error=f"timed out after {A.run_timeout} s" if rc == -9 else f"exit {rc}: {tail}")
    r["smi_gib"] = mem.stop()
    r["clocks"] = mem.clocks()
    r["wall_s"] = time.time() - t0
    return r


PEAK_RE = re.compile(r"peak[^\n]*?([0-9]+(?:\.[0-9]+)?)\s*(KiB|MiB|GiB|KB|MB|GB)", re.I)


BF16_MOMENTS = {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}   # train.exp_avg(_sq)_dtype
# a run kind's +flags: bf16m both moments in bf16, bf16m1 the first (exp_avg) alone, bf16m2 the second alone;
# keepqk the layers' q/k/v projection kept for the backward (train.keep_qk); bf16w the weights in bf16
# alone, no f32 master (train.main_params_dtype); lean the LM head's chunks of ~2,000 tokens at vocab 151936
# (train.lm_head_chunk_bytes 1.25GB, where the default's 4 GiB takes ~7,000); bf16r the residual stream in bf16
# (train.fp32_residual_connection false: what the bf16-weight transformers runs carry)
LK_FLAGS = {"bf16m": BF16_MOMENTS, "bf16m1": {"exp_avg_dtype": "bf16"}, "bf16m2": {"exp_avg_sq_dtype": "bf16"},
            "recompute": {"recompute": True}, "keepqk": {"keep_qk": True}, "bf16w": {"main_params_dtype": "bf16"},
            "lean": {"lm_head_chunk_bytes": "1.25GB"}, "bf16g": {"main_grads_dtype": "bf16"},
            "bf16r": {"fp32_residual_connection": False},
            # train.recompute_modules (their lists join: +renorm+remoe6 is [layernorm, moe:6]); train.recompute
            # of the first N layers (+recompute+n4)
            "renorm": {"recompute_modules": ["layernorm"]}, "remoe": {"recompute_modules": ["moe"]},
            "reqkv": {"recompute_modules": ["qkv"]},
            **{f"remoe{n}": {"recompute_modules": [f"moe:{n}"]} for n in range(1, 33)},
            **{f"reqkv{n}": {"recompute_modules": [f"qkv:{n}"]} for n in range(1, 33)},
            **{f"n{n}": {"recompute_num_layers": n} for n in range(1, 33)}}


# a run kind's +flags that set the environment instead: gemmtune, cuBLASLt's offers timed at the power cap on
# each GEMM shape's first call (LLMKERN_GEMM_TUNE, config/env.c)
LK_ENV_FLAGS = {"gemmtune": {"LLMKERN_GEMM_TUNE": "1"}}


def add_flags(extra, flag):
    """LK_FLAGS[flag]'s train keys into extra, lists joined."""
    for k, v in LK_FLAGS[flag].items():
        extra[k] = extra.get(k, []) + v if isinstance(v, list) else v
    return extra


# the run kinds --parity may add beside plain bf16 (--parity-kinds), and how its table names them
MOMENT_KINDS = {"bf16m": "bf16 moments", "bf16m1": "bf16 exp_avg", "bf16m2": "bf16 exp_avg_sq",
                "bf16w": "bf16 weights alone", "bf16g": "bf16 gradients", "bf16r": "bf16 residual stream"}


def kind_flags(kind):
    """A parity kind's train keys: bf16m+bf16w is both kinds' keys."""
    extra = {}
    for f in kind.split("+"):
        add_flags(extra, f)
    return extra


def kind_name(kind):
    return " + ".join(MOMENT_KINDS[f] for f in kind.split("+"))


def run_lk(A, label, dtype, init, tokens, B, S, steps, work, extra=None, attn=None, env=None):
    """`llmkern train --init INIT --json` of steps; per-step rates from its loss.csv; attn: an
    attention implementation in place of the default selection's; env: variables set for it."""
    out = os.path.join(work, label.replace(" ", "_"))
    warm = max(1, steps // 10)
    train = dict(steps=steps, lr=LR, min_lr=MIN_LR, warmup_steps=warm, weight_decay=WD, betas=BETAS, eps=EPS,
                 grad_clip=CLIP, batch_size=B, seq_len=S, log_every=1, save_every=0, out=out)
    train.update(extra or {})
    used = dtype
    for attempt in (dtype, None):
        cfg = os.path.join(work, f"{label.replace(' ', '_')}.yaml")
        with open(cfg, "w") as f:
            sections = dict(train=dict(train, **({"dtype": attempt} if attempt else {})),
                            data=dict(tokens=tokens, eos_id=-1))
            if attn:
                sections = dict(model=dict(ops_implementation=dict(attn_implementation=attn)), **sections)
            f.write(yaml_of(sections))
        shutil.rmtree(out, ignore_errors=True)
        cmd = [A.llmkern, "train", "--config", cfg, "--device", A.device, "--init", init, "--json", "--no-save"]
        mem = GpuMem(A.device == "cuda")
        mem.start()
        t0 = time.time()
        steps_json = []

        def on(ln):
            if ln.startswith("{"):
                st = json.loads(ln)
                steps_json.append(st)
                if st["step"] % max(1, steps // 6) == 0 or st["step"] == steps:
                    print(f"    {label}: step {st['step']}/{steps} loss {st['loss']:.4f} "
                          f"{st['tokens_per_s']:,.0f} tok/s (run average)", flush=True)
        rc, stderr = stream(cmd, A.run_timeout, on, env=dict(os.environ, **env) if env else None)
        smi = mem.stop()
        if rc == 2 and attempt and "unknown key 'dtype'" in stderr:
            print(f"    {label}: this llmkern has no train.dtype; running without it (f32)", flush=True)
            used = "f32 (no train.dtype in this binary)"
            continue
        break
    r = dict(cmd=" ".join(cmd), dtype=used, smi_gib=smi, clocks=mem.clocks(), wall_s=time.time() - t0, rc=rc)
    rows = []
    csv = os.path.join(out, "loss.csv")
    if os.path.exists(csv):
        rows = [ln.split(",") for ln in open(csv).read().splitlines()[1:] if ln]
    if rc != 0 and len(rows) <= A.warmup:
        tail = stderr.strip().splitlines()[-1:] or [f"exit {rc}"]
        r["error"] = ("timed out: " if rc == -9 else "") + tail[0][:200]
        return r
    if rc != 0:
        r["note"] = f"stopped after {len(rows)} steps (exit {rc})"
    r["losses"] = [float(x[1]) for x in rows]
    r["times"] = [B * S / float(x[4]) for x in rows]
    # the trainer's own run-average rates, for a window mean (robust if steps overlap); not for
    # train.cuda_graph, whose queued steps all report at the read that ends a log interval
    if steps_json and not (extra or {}).get("cuda_graph"):
        el = [s["step"] * B * S / s["tokens_per_s"] for s in steps_json]
        w = min(A.warmup, len(el) - 1)
        if len(el) > w + 1 and w > 0:
            r["window_tps"] = (len(el) - w) * B * S / (el[-1] - el[w - 1])
    peaks = [float(v) * {"k": 2**-20, "m": 2**-10, "g": 1}[u[0].lower()] for v, u in PEAK_RE.findall(stderr)]
    if peaks:
        r["alloc_gib"] = max(peaks)
        r["alloc_src"] = "llmkern's print"
    if not A.keep:   # the run's checkpoint (weights, AdamW state): GBs
        shutil.rmtree(out, ignore_errors=True)
    return r


def write_init(A, name, model, tokens, work, seed=1234):
    """llmkern's random initial weights as a HF checkpoint (`llmkern train --save-init`: no step)."""
    d = os.path.join(work, f"init-{name}")
    cfg = os.path.join(work, f"init-{name}.yaml")
    with open(cfg, "w") as f:
        f.write(yaml_of(dict(model=dict(model, torch_dtype="bfloat16"),
                             train=dict(steps=1, batch_size=1, seq_len=64, out=d, seed=seed),
                             data=dict(tokens=tokens, eos_id=-1))))
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.time()
    p = subprocess.run([A.llmkern, "train", "--config", cfg, "--device", A.device, "--save-init"],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"e2e_peers: writing the initial weights failed: {p.stdout}{p.stderr}")
    print(f"  initial weights: {d} ({time.time() - t0:.0f} s)", flush=True)
    return d


def summarize(r, A, B, S, fpt):
    if "times" in r and r["times"]:
        t = r["times"][A.warmup:] or r["times"]
        r["ms"] = statistics.median(t) * 1e3
        r["tps"] = B * S / statistics.median(t)
        r["tflops"] = r["tps"] * fpt / 1e12
        r["mfu"], r["of_cublas"] = r["tps"] * fpt / PEAK_TF, r["tps"] * fpt / CUBLAS_TF
    return r


def rounds_table(A, results):
    """--rounds N: each run kind's median tokens/s over its rounds, and an llmkern kind's ratio of
    medians to the peer's (Liger's run alone moved 70.7k-76.3k tokens/s between calls)."""
    if A.rounds < 2:
        return []
    out = ["", f"Over {A.rounds} rounds (the run kinds in turn, each round in the same order): median tokens/s",
           "", "| config | run | rounds | tokens/s (median) | each round | llmkern / peer (medians) |",
           "|---|---|---|---|---|---|"]
    med = {}
    for r in results:
        if r.get("tps"):
            med.setdefault((r["config"], r["kind"]), []).append(r["tps"])
    for (cfg, kind), v in med.items():
        ratio = ""
        peer = next((med[(cfg, k)] for k in ("liger", "hf") if (cfg, k) in med), None)
        if kind.startswith("llmkern") and peer:
            ratio = f"{statistics.median(v) / statistics.median(peer):.3f}x"
        out.append(f"| {cfg} | {kind} | {len(v)} | {statistics.median(v):,.0f} | "
                   f"{' / '.join(f'{t:,.0f}' for t in v)} | {ratio} |")
    return out


def perf(A):
    cfgs = {"dense": (TINY if A.tiny else DENSE, 64 if A.tiny else 4096, 2 if A.tiny else 8),
            "moe": (TINY_MOE if A.tiny else MOE, 64 if A.tiny else 4096, 2 if A.tiny else 4)}
    results, work = [], A.work
    for name in A.configs.split(","):
        model, S, B = cfgs[name]
        S, B = A.seq or S, A.batch or B
        fpt, total, active = flops_per_token(model, S)
        print(f"== {name}: {total / 1e6:.4g} M parameters ({active / 1e6:.4g} M active matmul), seq {S} x batch {B}, "
              f"{fpt / 1e9:.2f} GFLOP/token", flush=True)
        tokens = os.path.join(work, f"tokens-{name}.lktok")
        write_tokens(tokens, model["vocab_size"], A.batches * B * S, seed=1)
        init = write_init(A, name, model, tokens, work)
        for rnd, kind in ((rnd, kind) for rnd in range(A.rounds) for kind in A.runs.split(",")):
            label = f"{name} {kind}" + (f" #{rnd + 1}" if A.rounds > 1 else "")
            print(f"  {label} ...", flush=True)
            base, _, attn = kind.partition(":")   # llmkern:cudnn: that attention row instead of the default's
            base, *flags = base.split("+")        # llmkern+bf16m+recompute: those train: keys set
            if base == "llmkern_graph" and A.device != "cuda":
                r = dict(skip="train.cuda_graph needs a GPU")
            elif base in ("llmkern", "llmkern_graph"):
                # llmkern_graph: train.cuda_graph, the step replayed; its losses are read once per log
                # interval (10 steps): its steps queue
                extra = {"cuda_graph": True, "log_every": 10} if base == "llmkern_graph" else {}
                env = {}
                for f in flags:
                    if f in LK_ENV_FLAGS:
                        env.update(LK_ENV_FLAGS[f])
                    else:
                        add_flags(extra, f)
                r = run_lk(A, label, A.lk_dtype, init, tokens, B, S, A.steps, work, extra, attn or None, env)
            else:
                r = run_hf(A, label, kind, A.hf_dtype, init, tokens, B, S, A.steps, work)
                r["dtype"] = A.hf_dtype
                r.setdefault("alloc_src", "torch max_memory_allocated")
            r.update(config=name, kind=kind, round=rnd + 1, seq=S, batch=B, flops_per_token=fpt, params=total,
                     active=active)
            results.append(summarize(r, A, B, S, fpt))
            brief = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()
                     if k in ("tps", "ms", "alloc_gib", "smi_gib", "error", "skip", "note", "dtype", "window_tps",
                              "clocks")}
            print(f"  {label}: {brief}", flush=True)
        if not A.keep:
            shutil.rmtree(init, ignore_errors=True)

    dev = next((r["gpu"] for r in results if r.get("gpu")), "CPU" if A.device == "cpu" else A.device)
    vers = next((f"torch {r['torch']}, transformers {r['transformers']}" for r in results if r.get("torch")), "")
    lig = next((r["liger"] for r in results if r.get("liger")), None)
    head = (f"# End to end: llmkern vs transformers (SDPA) ± Liger-Kernel, {A.steps} steps a run (median step after "
            f"{A.warmup}), same initial weights and random tokens\n\n{dev}; {vers}"
            f"{f', Liger-Kernel {lig}' if lig else ''}; llmkern {A.llmkern}. MFU of {PEAK_TF / 1e12:.0f} TFLOP/s "
            f"(H200 dense bf16); 'of cuBLAS': of the {CUBLAS_TF / 1e12:.0f} TFLOP/s a bf16 8192^3 GEMM reaches here. "
            "Peak: the allocator's (torch max_memory_allocated, or llmkern's own print) and nvidia-smi memory.used "
            "above idle, polled (whole process: context, caches).\n")
    lines = [head, "| config | run | dtype | tokens/s | ms/step | TFLOP/s | MFU | of cuBLAS | peak GiB (allocator) "
             "| peak GiB (nvidia-smi) | llmkern / peer |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    f2 = lambda v: "—" if v is None else f"{v:.1f}"  # noqa: E731
    for r in results:
        what = r.get("error") or r.get("skip")
        if what or "tps" not in r:
            lines.append(f"| {r['config']} | {r['kind']} | {r.get('dtype', '')} | {what or 'no steps'} "
                         f"| | | | | | {f2(r.get('smi_gib'))} | |")
            continue
        ratio = ""
        if r["kind"].startswith("llmkern"):   # against the peer of the same round
            peer = next((p for k in ("liger", "hf") for p in results if p["config"] == r["config"] and
                         p["kind"] == k and p["round"] == r["round"] and p.get("tps")), None)
            if peer:
                r["ratio"] = r["tps"] / peer["tps"]
                ratio = f"{r['ratio']:.2f}x HF{'+Liger' if peer['kind'] == 'liger' else ''}"
        kind = r["kind"] + (f" #{r['round']}" if A.rounds > 1 else "")
        lines.append(f"| {r['config']} | {kind} | {r['dtype']} | {r['tps']:,.0f} | {r['ms']:.1f} "
                     f"| {r['tflops']:.3g} | {r['mfu'] * 100:.1f}% | {r['of_cublas'] * 100:.1f}% "
                     f"| {f2(r.get('alloc_gib'))} | {f2(r.get('smi_gib'))} | {ratio} |")
    lines += rounds_table(A, results)
    notes = [f"- {r['config']} {r['kind']}: {r['note']}" for r in results if r.get("note")]
    notes += [f"- {r['config']} {r['kind']}: the mean over the steps after the warm-up (its own run-average rates) is "
              f"{r['window_tps']:,.0f} tokens/s, {abs(r['window_tps'] / r['tps'] - 1) * 100:.0f}% off the median"
              for r in results if r.get("window_tps") and r.get("tps") and abs(r["window_tps"] / r["tps"] - 1) > 0.1]
    clk = [f"{r['config']} {r['kind']} {clocks_text(r['clocks'])}" for r in results if r.get("clocks")]
    if clk:
        notes.append("- the GPU while busy (nvidia-smi, utilization >= 90%: median SM clock, power, samples, "
                     "temperature, and the share of samples each clock event reason held): " + "; ".join(clk))
    text = "\n".join(lines + ([""] + notes if notes else [])) + "\n"
    print("\n" + text, flush=True)
    open(os.path.join(A.out, "e2e_peers.md"), "w").write(text)
    json.dump(dict(device=dev, versions=vers, liger=lig, steps=A.steps, warmup=A.warmup, peak_tflops=PEAK_TF / 1e12,
                   cublas_tflops=CUBLAS_TF / 1e12, runs=results), open(os.path.join(A.out, "e2e_peers.json"), "w"),
              indent=1)


def parity_once(A, model, S, B, steps, rep):
    """One repetition: its own initial weights and batches (seeded by rep), the five runs and
    the mean absolute loss difference of each pair."""
    tokens = os.path.join(A.work, f"tokens-parity{rep}.lktok")
    write_tokens(tokens, model["vocab_size"], A.batches * B * S, seed=2 + rep)
    init = write_init(A, f"parity{rep}", model, tokens, A.work, seed=1234 + rep)
    # transformers' two bf16s: autocast over f32 weights (Trainer(bf16=True)) and bf16 weights (the
    # throughput runs' and PEERS-H200.md's setting); --parity-hf-bf16 names the one the verdict uses
    runs = {"llmkern bf16": run_lk(A, "parity llmkern bf16", "bf16", init, tokens, B, S, steps, A.work),
            "llmkern f32": run_lk(A, "parity llmkern f32", "f32", init, tokens, B, S, steps, A.work),
            **{f"llmkern {f}": run_lk(A, f"parity llmkern {f}", "bf16", init, tokens, B, S, steps, A.work,
                                      kind_flags(f)) for f in A.parity_kinds},
            "hf autocast": run_hf(A, "parity hf autocast", "hf", "amp", init, tokens, B, S, steps, A.work),
            "hf bf16 weights": run_hf(A, "parity hf bf16 weights", "hf", "bf16", init, tokens, B, S, steps, A.work),
            "hf f32": run_hf(A, "parity hf f32", "hf", "f32", init, tokens, B, S, steps, A.work)}
    if not runs["llmkern bf16"].get("dtype", "").startswith("bf16"):
        runs["llmkern bf16"]["error"] = "this llmkern has no train.dtype: no bf16 run"
    if not A.keep:
        shutil.rmtree(init, ignore_errors=True)

    def mad(a, b):
        x, y = runs[a].get("losses"), runs[b].get("losses")
        if not x or not y or runs[a].get("error") or runs[b].get("error"):
            return None
        n = min(len(x), len(y))
        return dict(mean=sum(abs(p - q) for p, q in zip(x, y)) / n, max=max(abs(p - q) for p, q in zip(x, y)),
                    steps=n)
    pairs = {"llmkern bf16 vs f32": mad("llmkern bf16", "llmkern f32"),
             **{f"llmkern bf16 + {kind_name(f)} vs f32": mad(f"llmkern {f}", "llmkern f32") for f in A.parity_kinds},
             "hf autocast bf16 vs f32": mad("hf autocast", "hf f32"),
             "hf bf16 weights vs f32": mad("hf bf16 weights", "hf f32"),
             "llmkern f32 vs hf f32 (same model?)": mad("llmkern f32", "hf f32")}
    return runs, pairs


def parity(A):
    """--parity-repeats N runs the comparison N times from other weights and batches: one pair of
    runs moved transformers' own autocast pair by 10% between two calls, so the verdict is on
    the pairs' means over the repetitions."""
    model = dict(TINY if A.tiny else DENSE, num_hidden_layers=A.parity_layers or (2 if A.tiny else 4))
    S, B = A.parity_seq or (64 if A.tiny else 1024), A.parity_batch or (2 if A.tiny else 4)
    steps = A.parity_steps or (30 if A.tiny else 200)
    n_rep = max(1, A.parity_repeats)
    print(f"== parity: Qwen3 {model['num_hidden_layers']} layers, hidden {model['hidden_size']}, seq {S} x batch {B}, "
          f"{steps} steps, {A.batches} batches in turn, {n_rep} repetition(s) from seed {A.parity_first}", flush=True)
    reps = [parity_once(A, model, S, B, steps, r) for r in range(A.parity_first, A.parity_first + n_rep)]
    names = list(reps[0][1])
    pairs = {}
    for k in names:
        got = [p[k] for _, p in reps if p[k]]
        pairs[k] = (dict(mean=sum(v["mean"] for v in got) / len(got), max=max(v["max"] for v in got),
                         steps=got[0]["steps"], each=[v["mean"] for v in got]) if len(got) == n_rep else None)
    verdict = "hf autocast bf16 vs f32" if A.parity_hf_bf16 == "amp" else "hf bf16 weights vs f32"
    lines = [f"# Loss parity, {steps} steps from the same weights on the same batches ({A.device}), "
             f"mean over {n_rep} repetition(s)\n",
             "| pair | mean abs loss diff | max | steps | each repetition |", "|---|---|---|---|---|"]
    for k, v in pairs.items():
        lines.append(f"| {k} | " + (f"{v['mean']:.5f} | {v['max']:.5f} | {v['steps']} | "
                                    f"{', '.join(f'{e:.5f}' for e in v['each'])} |" if v else "not measured | | | |"))
    lines.append("")
    for r, (runs, _) in enumerate(reps, A.parity_first):   # r: the repetition's seed
        for k, run in runs.items():
            if run.get("error") or run.get("losses"):
                lines.append(f"- {k} ({r}): " + (run.get("error") or
                                                 f"loss {run['losses'][0]:.4f} -> {run['losses'][-1]:.4f}"))
    for mine in [k for k in pairs if k.startswith("llmkern bf16")]:
        a = pairs[mine]
        for name in ("hf autocast bf16 vs f32", "hf bf16 weights vs f32"):
            b = pairs[name]
            if a and b:
                lines.append(f"\n{mine} {'is within' if a['mean'] <= b['mean'] else 'is NOT within'} "
                             f"{name} ({a['mean']:.5f} vs {b['mean']:.5f}){' (the verdict)' if name == verdict else ''}")
    # llmkern f32 and transformers f32 run the same model: their gap is rounding (about transformers'
    # own bf16 pair); ten times it was a wrong loss (bench/NOTES.md, twenty-fifth session)
    same, ref = pairs.get("llmkern f32 vs hf f32 (same model?)"), pairs.get("hf autocast bf16 vs f32")
    if same and ref and same["mean"] > 5 * ref["mean"]:
        lines.append(f"\nWARNING: llmkern f32 and transformers f32 differ by {same['mean']:.5f}, "
                     f"{same['mean'] / ref['mean']:.1f}x transformers' own bf16 pair: more than rounding, "
                     f"a loss or a gradient is wrong")
    text = "\n".join(lines) + "\n"
    print("\n" + text, flush=True)
    open(os.path.join(A.out, "e2e_parity.md"), "w").write(text)
    json.dump(dict(pairs=pairs, runs=[runs for runs, _ in reps]),
              open(os.path.join(A.out, "e2e_parity.json"), "w"), indent=1)


def main():
    P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    P.add_argument("--llmkern", default=os.path.join(os.environ.get("B", "build"), "llmkern"), help="the CLI")
    P.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    P.add_argument("--steps", type=int, default=30)
    P.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    P.add_argument("--configs", default="dense,moe")
    P.add_argument("--runs", default="hf,liger,llmkern,llmkern_graph",
                   help="hf before liger: each is its own process anyway; llmkern_graph: train.cuda_graph; "
                        "llmkern+bf16m[+recompute]: AdamW moments in bf16 [, train.recompute] (bf16m1: exp_avg alone, "
                        "bf16m2: exp_avg_sq alone); +keepqk: train.keep_qk; +bf16w: train.main_params_dtype bf16; +lean: train.lm_head_chunk_bytes 1.25GB; +bf16r: train.fp32_residual_connection false; +gemmtune: LLMKERN_GEMM_TUNE=1; "
                        "llmkern[_graph]:NAME runs attention implementation NAME (cudnn, flash_attention_2)")
    P.add_argument("--rounds", type=int, default=1,
                   help="every run kind N times, in turn (round 1's kinds, then round 2's ...); each llmkern run's "
                        "ratio against the peer of its round, and a table of the medians")
    P.add_argument("--seq", type=int, help="override both configs' seq")
    P.add_argument("--batch", type=int, help="override both configs' batch")
    P.add_argument("--batches", type=int, default=4, help="distinct random batches, used in turn")
    P.add_argument("--lk-dtype", default="bf16", choices=["bf16", "f32"], help="llmkern's train.dtype")
    P.add_argument("--hf-dtype", default="bf16", choices=["bf16", "f32", "amp"], help="transformers' weights")
    P.add_argument("--run-timeout", type=int, default=150, help="seconds a run may take (then: its steps so far)")
    P.add_argument("--parity", action="store_true", help="the loss-parity check instead of the throughput runs")
    P.add_argument("--parity-steps", type=int)
    P.add_argument("--parity-layers", type=int)
    P.add_argument("--parity-seq", type=int)
    P.add_argument("--parity-batch", type=int)
    P.add_argument("--parity-hf-bf16", default="amp", choices=["amp", "weights"])
    P.add_argument("--parity-repeats", type=int, default=1,
                   help="the comparison again from other initial weights and batches; the verdict on the means")
    P.add_argument("--parity-first", type=int, default=0,
                   help="the first repetition's seeds (repetition r draws its weights and batches from seed r)")
    P.add_argument("--parity-kinds", default="bf16m,bf16m1,bf16m2",
                   help="the llmkern bf16 runs beside the plain one (bf16m, bf16m1, bf16m2, bf16w, bf16g, bf16r; joined by +: bf16m+bf16w)")
    P.add_argument("--tiny", action="store_true", help="2-layer models, seq 64 x 2, 8 steps (checks the script)")
    P.add_argument("--out", default=os.environ.get("OUT", "."))
    P.add_argument("--work", help="where checkpoints and token files go (default: a temporary directory)")
    P.add_argument("--keep", action="store_true", help="keep the work directory's checkpoints")
    P.add_argument("--worker", help=argparse.SUPPRESS)
    A = P.parse_args()
    A.parity_kinds = [f for f in A.parity_kinds.split(",") if f]
    bad = [f for f in A.parity_kinds if any(p not in MOMENT_KINDS for p in f.split("+"))]
    if bad:
        P.error(f"--parity-kinds: {', '.join(bad)} unknown ({', '.join(MOMENT_KINDS)})")
    if A.worker:
        res = worker(json.load(open(A.worker)))
        print(json.dumps({"result": res}), flush=True)
        return
    if A.tiny and A.steps == 30:
        A.steps, A.warmup = 8, 2
    if not os.access(A.llmkern, os.X_OK):
        sys.exit(f"e2e_peers: --llmkern {A.llmkern}: not an executable (build the llmkern_cli target)")
    os.makedirs(A.out, exist_ok=True)
    made = A.work is None
    A.work = A.work or tempfile.mkdtemp(prefix="e2e_peers.", dir=os.environ.get("TMPDIR", "/tmp"))
    os.makedirs(A.work, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import triton_cache
    cache = triton_cache.seed()   # Liger's MoE autotune results for the runs (their processes inherit it)
    t0 = time.time()
    try:
        parity(A) if A.parity else perf(A)
    finally:
        if made and not A.keep:
            shutil.rmtree(A.work, ignore_errors=True)
    n = triton_cache.harvest(cache, A.out)   # new Liger autotune results, to keep in bench/liger_autotune/
    print(f"e2e_peers: {time.time() - t0:.0f} s; {A.out}/e2e_{'parity' if A.parity else 'peers'}.md"
          + (f"; {n} new Triton autotune results in {A.out}/liger_autotune_new.tgz" if n else ""), flush=True)


if __name__ == "__main__":
    main()
