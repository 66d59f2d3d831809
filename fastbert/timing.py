"""Timing helpers shared by the benchmarks and `fastbert selfcheck`: one way to time, one place."""
from __future__ import annotations

import statistics
import time
from typing import Callable, List, Optional

import torch


def cpu_times(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 15, budget_s: Optional[float] = None) -> List[float]:
    """Wall-clock seconds of `repeats` calls of fn() after `warmup` calls (fewer when budget_s runs out)."""
    for _ in range(warmup):
        fn()
    times: List[float] = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if budget_s is not None and time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    return times


def median_s(fn: Callable[[], object], *, device: str = "cpu", **kw) -> float:
    """Median seconds per call: triton.testing.do_bench on CUDA, perf_counter medians on the CPU."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median") / 1e3
    return statistics.median(cpu_times(fn, **kw))


def machine_info() -> dict:
    import platform

    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "processor": _cpu_name(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        pass
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"
