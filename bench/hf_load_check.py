#!/usr/bin/env python3
"""hf_load_check.py — does a directory written by `llmkern train` load in Hugging Face
transformers as it is, and did its weights arrive intact?

Loads each directory with AutoModelForCausalLM.from_pretrained and scores a line in the
style of llmkern's embedded corpus with the byte-level tokenizer (BOS 256, ids = bytes).
A trained tiny model scores far below the untrained ln(320) = 5.77; a mis-mapped tensor
would not. Run (on a machine with torch + transformers):
    python3 bench/hf_load_check.py out/tiny-moe out/tiny-dense
"""
import math
import sys

import torch
from transformers import AutoModelForCausalLM

TEXT = b"The quick brown fox sees the lazy dog. 17 + 25 = 42. name: Alice\n"


def main():
    ok = True
    ids = torch.tensor([[256] + list(TEXT) + [257]])
    for d in sys.argv[1:]:
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        m.eval()
        with torch.no_grad():
            loss = m(ids, labels=ids).loss.item()
        n = sum(p.numel() for p in m.parameters())
        good = math.isfinite(loss) and loss < 0.75 * math.log(320)
        ok &= good
        print(f"{d}: {type(m).__name__}, {n} parameters, loss {loss:.4f} on a corpus-style line "
              f"(untrained ~{math.log(320):.2f}): {'OK' if good else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
