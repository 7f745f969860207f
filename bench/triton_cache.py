"""triton_cache.py — Liger-Kernel's Triton autotune results, carried (bench/liger_autotune/).

Liger's fused MoE autotunes its Triton GEMMs at the first call of each shape: 207 s of an
H200 at PEERS-H200.md's MoE shape (bench/NOTES.md, eleventh session), a large part of a
session's device time. Triton (TRITON_CACHE_AUTOTUNING=1) keeps each kernel's autotune
result, every config's timings and the winner, as <hash>/<kernel>.autotune.json in its
cache directory; bench/liger_autotune/ holds those of the H200 runs. seed() copies them into
a fresh cache directory and points Triton at it (only when TRITON_CACHE_DIR is unset): a
Triton, Liger or GPU other than the ones that made them hashes to other directories, and
Liger then autotunes as before. The results are Liger's own autotuner's, so Liger still runs
its fastest configs. New results land in that directory too: copy its *.autotune.json
files here to keep them."""
import os
import shutil
import tempfile

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "liger_autotune")


def seed():
    """Set TRITON_CACHE_DIR (a new directory holding bench/liger_autotune/) and
    TRITON_CACHE_AUTOTUNING=1 for this process and its children; returns the directory."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    d = tempfile.mkdtemp(prefix="lk-triton-")
    if os.path.isdir(HERE):
        shutil.copytree(HERE, d, dirs_exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = d
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    return d
