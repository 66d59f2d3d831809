"""How GEMM speed is measured: what a measurement holds for (`here`), the rounds of timed calls that
rank paths (`time_paths`), and the caches of measured choices (`cache`), which `forget` clears
together. fastbert.ops.gemm (the GEMM paths' choice) and fastbert.ops.int8 (the int8 weight layout's)
both measure with it.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from fastbert import backend

TIMED_RUNS = 3  # rounds of timed calls at least, after one untimed call; the minimum is kept
MAX_ROUNDS = 9  # rounds at most, for the paths still in contention
CONTENDING = 1.15  # a path within this factor of the fastest's time is still in contention

_caches: List[dict] = []


def here() -> Tuple[int, Optional[str]]:
    """(threads, C++ kernel level): what a measurement of GEMM speed holds for."""
    return torch.get_num_threads(), backend.cpu_capability()


def time_paths(paths: List[str], run: Callable[[str], object]) -> Dict[str, float]:
    """{path: seconds}: the fastest of each path's timed calls after one untimed call, the paths taken
    in turn round after round, so that a drift of the machine's speed hits them alike.

    TIMED_RUNS rounds, then more, up to MAX_ROUNDS, for the paths still within CONTENDING of the
    fastest, while two or more are: the first few calls of a library's kernel on a new shape run
    slower than its later ones, and single calls on a shared machine spread by more than close paths
    differ, so that the fastest of three calls ranked such paths at random (benchmarks/LOG.md, "fp32
    batches: every GEMM path in the one-call layer"). A path out of contention keeps
    the minimum it had."""
    best = {}
    for path in paths:
        run(path)
        best[path] = float("inf")
    timed = list(paths)
    for done in range(MAX_ROUNDS):
        for path in timed:
            t0 = time.perf_counter()
            run(path)
            best[path] = min(best[path], time.perf_counter() - t0)
        if done + 1 >= TIMED_RUNS:
            fastest = min(best[p] for p in timed)
            timed = [p for p in timed if best[p] <= CONTENDING * fastest]
            if len(timed) < 2:
                break
    return best


def cache() -> dict:
    """A new, empty cache of measured choices, one that forget() clears."""
    out: dict = {}
    _caches.append(out)
    return out


def forget() -> None:
    """Clear every cache of measured choices (each is measured again when next asked for)."""
    for c in _caches:
        c.clear()
