"""Freed memory given back to the system in long-running loops: `fastbert serve`'s worker, the
corpus job (`fastbert embed`, its Ray actors).

glibc's malloc keeps what a process frees in its arenas for the next allocations, and returns to
the system only what lies at the top of a heap. A loop whose allocations change size at every step
(a batch of other lengths each time: tensors of a few hundred KiB to a few MiB, under fastbert's
own allocator for large outputs, fastbert._C.empty) leaves free blocks spread through the heap, and
the process's resident memory creeps up with the shapes it meets: a server under mixed-length
requests grew from 1,140 to 1,480 MiB over 300 requests while malloc had 149 MiB in use throughout
(benchmarks/RESULTS.md). malloc_trim(0) hands the free pages inside the heap back (MADV_DONTNEED)
without moving anything; it walks the free blocks, which takes a while on a heap of that size
(benchmarks/LOG.md, "Memory under a long load: steady after warm-up"), so a loop calls it at most
once every `every` seconds.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from typing import Callable, Optional, Union

TRIM_EVERY = 10.0  # seconds between trims at most: a trim's time (see above) is a small share of that


def _malloc_trim() -> Optional[Callable[[int], int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc's; musl has none
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def trim_now() -> bool:
    """Give the free pages of malloc's heaps back to the system now; False where malloc has no trim."""
    if _TRIM is None:
        return False
    _TRIM(0)  # ctypes lets the GIL go for the call: other threads run meanwhile
    return True


class Trimmer:
    """trim_now() at most once every `every` seconds: call it after each step of a loop."""

    def __init__(self, every: float = TRIM_EVERY):
        self.every = every
        self.last = time.monotonic()

    def __call__(self) -> bool:
        """True when this call trimmed."""
        now = time.monotonic()
        if now - self.last < self.every:
            return False
        self.last = now
        return trim_now()


def resident_mib(pid: Union[int, str] = "self", peak: bool = False) -> Optional[float]:
    """A process's resident set now (VmRSS), or its highest so far (VmHWM, peak=True), in MiB, as
    Linux reports it; None where the process is gone or there is no /proc."""
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
