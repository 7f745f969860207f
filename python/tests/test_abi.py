"""test_abi.py — every ctypes struct of llmkern/_lib.py against the C headers: a program
compiled from include/llmkern prints each struct's size and each field's offset, and
they must equal ctypes'. A field added to a header and not to _lib.py (or moved) fails
here, before any call could write past a struct."""
import os
import shutil
import subprocess

import pytest

from llmkern import _lib as L

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "llmkern/llmkern.h"', "int main(void) {"]
    for py, c in L.ABI_STRUCTS.items():
        cls = getattr(L, py)
        lines.append(f'    printf("{py} size %zu\\n", sizeof({c}));')
        for f in cls._fields_:
            lines.append(f'    printf("{py} {f[0]} %zu\\n", offsetof({c}, {f[0]}));')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_structs_match_the_headers(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on the PATH to read the headers with")
    src, exe = tmp_path / "abi.c", tmp_path / "abi"
    src.write_text(_c_program())
    subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), str(src), "-o", str(exe)], check=True)
    seen = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        py, field, value = line.split()
        seen[(py, field)] = int(value)
    bad = []
    for py in L.ABI_STRUCTS:
        cls = getattr(L, py)
        import ctypes
        if seen[(py, "size")] != ctypes.sizeof(cls):
            bad.append(f"{py}: size C {seen[(py, 'size')]} ctypes {ctypes.sizeof(cls)}")
        for f in cls._fields_:
            off = getattr(cls, f[0]).offset
            if seen[(py, f[0])] != off:
                bad.append(f"{py}.{f[0]}: offset C {seen[(py, f[0])]} ctypes {off}")
    assert not bad, "\n".join(bad)
