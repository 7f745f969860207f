"""triton_cache.py — Liger-Kernel's Triton autotune results, carried (bench/liger_autotune/).

Liger's fused MoE autotunes its Triton GEMMs at the first call of each shape: 207 s of an
H200 at PEERS-H200.md's MoE shape (bench/NOTES.md, eleventh session), a large part of a
session's device time. Triton (TRITON_CACHE_AUTOTUNING=1) keeps each kernel's autotune
result, every config's timings and the winner, as <hash>/<kernel>.autotune.json in its
cache directory; bench/liger_autotune/ holds those of the H200 runs. seed() copies them into
a fresh cache directory and points Triton at it (only when TRITON_CACHE_DIR is unset): a
Triton, Liger or GPU other than the ones that made them hashes to other directories, and
Liger then autotunes as before. The results are Liger's own autotuner's, so Liger still runs
its fastest configs. New results land in that directory too: harvest() packs the ones not
yet here into OUT/liger_autotune_new.tgz (`tar -xzf` it in bench/liger_autotune/ to keep
them)."""
import os
import shutil
import tarfile
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


def harvest(cache, out):
    """Pack the *.autotune.json files of cache that bench/liger_autotune/ lacks into
    out/liger_autotune_new.tgz (paths <hash>/<kernel>.autotune.json); returns how many."""
    new = []
    for root, _, files in os.walk(cache):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), cache)
            if f.endswith(".autotune.json") and not os.path.exists(os.path.join(HERE, rel)):
                new.append(rel)
    if new:
        with tarfile.open(os.path.join(out, "liger_autotune_new.tgz"), "w:gz") as t:
            for rel in new:
                t.add(os.path.join(cache, rel), arcname=rel)
    return len(new)
