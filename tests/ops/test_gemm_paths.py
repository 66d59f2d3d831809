"""fastbert.ops.gemm_paths: oneDNN's primitive caches (its own and torch's ideep's) bounded, so a loop
that meets a new row count at every batch (a sentence encoder's, a server's) does not grow with the
shapes it has seen."""
import os
import subprocess
import sys

import pytest

from fastbert.ops.gemm_paths import ONEDNN_CACHES

# Runs in a fresh process: oneDNN reads its cache's capacity once, at its first primitive. Prints the
# bytes malloc holds in use after 100 distinct row counts through the onednn path (both caches full at
# fastbert's capacity), then after 200 more.
LOOP = r"""
import ctypes, sys
import torch
import fastbert
from fastbert.ops import gemm

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                 "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if not gemm.candidates("fwd", torch.float32).count("onednn"):
    print("absent")
    sys.exit(0)
w = torch.randn(1536, 384)
torch.set_num_threads(1)
used = []
with torch.inference_mode(), gemm.forced("onednn"):
    for rows in range(1, 301):
        fastbert.ops.linear(torch.randn(rows, 384), w)
        if rows in (100, 300):
            used.append(libc.mallinfo2().uordblks)
print(*used)
"""


def _loop(env):
    out = subprocess.run([sys.executable, "-c", LOOP], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def _unset():
    return {k: v for k, v in os.environ.items() if k not in ONEDNN_CACHES}


@pytest.mark.slow
def test_onednn_keeps_a_bounded_cache_of_primitives():
    import platform

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc's figures are read through glibc's mallinfo2")
    got = _loop(_unset())
    if got == ["absent"]:
        pytest.skip("this torch has no oneDNN linear (the onednn GEMM path): nothing to bound")
    at100, at300 = (int(x) for x in got)
    # at oneDNN's and ideep's defaults (1024 each) every new row count's primitives are kept: the same
    # loop grows by tens of MiB; at fastbert's 64 (full after 64 row counts) it stays level
    default = [int(x) for x in _loop({**_unset(), **{name: "1024" for name in ONEDNN_CACHES}})]
    assert default[1] - default[0] > 16 << 20, default
    assert at300 - at100 < 1 << 20, (at100, at300)


def test_a_capacity_the_user_set_is_kept():
    code = "import os, fastbert; print(*(os.environ[n] for n in fastbert.ops.gemm_paths.ONEDNN_CACHES))"
    run = [sys.executable, "-c", code]
    assert subprocess.run(run, env=_unset(), capture_output=True, text=True).stdout.split() == ["64", "64"]
    env = {**_unset(), "LRU_CACHE_CAPACITY": "8"}
    assert subprocess.run(run, env=env, capture_output=True, text=True).stdout.split() == ["64", "8"]
