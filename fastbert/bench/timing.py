"""Timing helpers shared by the benchmarks and `fastbert selfcheck`: one way to time, one place."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

import fastbert.backend


def interleaved_cpu_times(
    fns: Dict[str, Callable[[], object]], *, warmup: int = 2, repeats: int = 25, budget_s: Optional[float] = None,
    runs: int = 1, settle_s: float = 0.0,
) -> Dict[str, List[float]]:
    """Wall-clock seconds of `repeats` rounds in which every fn is called once, in turn.

    Calling the contenders in turn, rather than one after the other, gives each of them the same
    machine: the same clock speed, the same neighbours, the same state of malloc's heap. On a shared
    2-core VM, timings taken a few seconds apart drift by more than the differences measured here.
    A round is dropped from nobody: the budget (seconds in all) only cuts the number of rounds.
    runs > 1: in each round every fn is called `runs` times in a row and the first call of the run is
    not timed: it pays for the switch (the thread pools of the engine before it, ONNX Runtime's and
    OpenMP's, spin-wait for more work for a while after their call returns; its own pools wake).
    settle_s: an untimed pause before each fn's turn, for the pools of the one before it to stop
    spinning (Intel's OpenMP spins 200 ms by default) before the untimed call."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    for _ in range(repeats):
        for name, fn in fns.items():
            if settle_s:
                time.sleep(settle_s)
            if runs > 1:
                fn()
            for _ in range(max(1, runs - 1)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        if budget_s is not None and time.perf_counter() - start > budget_s and len(times[name]) >= 5:
            break
    return times


def median_s(fns: Dict[str, Callable[[], object]], *, device: str = "cpu", **kw) -> Dict[str, float]:
    """Median seconds per call of each fn: triton.testing.do_bench on CUDA, medians of
    interleaved perf_counter rounds (interleaved_cpu_times) on the CPU."""
    if device == "cuda":
        from triton.testing import do_bench

        return {name: do_bench(fn, return_mode="median") / 1e3 for name, fn in fns.items()}
    return {name: statistics.median(t) for name, t in interleaved_cpu_times(fns, **kw).items()}



# Products of the shapes an encoder's feed-forward has at large batches (BERT-base: hidden 768, 3072).
FLOOR_SHAPES = ((4096, 768, 3072), (4096, 3072, 768), (4096, 768, 768))


def fp32_gemm_rate(shapes=FLOOR_SHAPES, repeats: int = 5) -> Dict[str, float]:
    """The best fp32 GEMM rate this machine reaches, in GFLOP/s (2*m*k*n per product), on large
    products where the library's packing pays for itself: for each shape the best of `repeats`
    calls of torch.mm (MKL or oneDNN) and of fastbert.ops.linear (its measured path choice).
    Returns {"gflops": the best, "shape": "MxKxN", "by": which}: a model's fp32 work cannot go
    faster than that on this CPU, whatever engine runs it."""
    from fastbert.ops import linear

    best = {"gflops": 0.0, "shape": "", "by": ""}
    g = torch.Generator().manual_seed(0)
    for m, k, n in shapes:
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        wt = w.t().contiguous()
        calls = {"torch.mm": (torch.mm, x, wt), "fastbert linear": (linear, x, w)}
        for by, (fn, a, b) in calls.items():
            fn(a, b)
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn(a, b)
                rate = 2 * m * k * n / (time.perf_counter() - t0) / 1e9
                if rate > best["gflops"]:
                    best = {"gflops": rate, "shape": f"{m}x{k}x{n}", "by": by}
    return best


def memory_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """The memory bandwidth this machine reaches, in GB/s: the best of `repeats` copies of an fp32
    tensor of `nbytes` (far past the caches) into another, each copy counted as its read and its
    write. An op that must move B bytes cannot take less than B / this on this CPU, whatever runs it."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # the pages of both faulted in before the timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


GATED_FAMILIES = ("modernbert", "gte", "nomic_bert", "eurobert")  # model types whose feed-forward is gated


def _product_flops_per_token(config) -> float:
    """FLOPs of one token through one layer's products: the four attention projections (the key and
    value ones narrower with grouped-query attention, EuroBERT's num_key_value_heads) and the
    feed-forward (a gated one, ModernBERT's, GTE's, NomicBERT's and EuroBERT's: a projection to
    twice the intermediate size, then back), 2 FLOPs per multiply-add."""
    d, f = config.hidden_size, config.intermediate_size
    heads = getattr(config, "num_attention_heads", None) or 1
    head_dim = getattr(config, "head_dim", None) or d // heads
    width = heads * head_dim  # of the queries and the context
    kv_width = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    geglu = getattr(config, "model_type", None) in GATED_FAMILIES
    return 2 * (2 * d * width + 2 * d * kv_width + (3 if geglu else 2) * d * f)


def encoder_flops_per_token(config, mean_tokens: float) -> float:
    """FLOPs of one token through an encoder's layers (config: hidden_size, intermediate_size,
    num_hidden_layers): its products, plus the two attention products against a sequence of
    mean_tokens. Pooling, embeddings and the elementwise ops are left out (a few per cent)."""
    return config.num_hidden_layers * (_product_flops_per_token(config) + 4 * mean_tokens * config.hidden_size)


def encoder_flops(config, lengths) -> float:
    """FLOPs of an encoder's products on sequences of `lengths`: each layer's projections and
    feed-forward, and its two attention products over the query-key pairs it computes (only those
    in the window, in ModernBERT's sliding layers: config.layer_types, sliding_window). Embeddings,
    norms and the elementwise ops are left out."""
    n_layers = config.num_hidden_layers
    flops = _product_flops_per_token(config) * sum(int(n) for n in lengths) * n_layers
    for kind in getattr(config, "layer_types", None) or ["full_attention"] * n_layers:
        window = config.sliding_window if kind == "sliding_attention" else None
        flops += 4 * config.hidden_size * attention_pairs(lengths, window)
    return flops


def attention_pairs(lengths, window: Optional[int]) -> int:
    """Query-key pairs an attention layer must compute over sequences of `lengths`: every pair, or
    with a sliding window (keys within `window` positions on each side) those inside it."""
    pairs = 0
    for n in [int(x) for x in lengths]:
        if window is None:
            pairs += n * n
        else:
            i = torch.arange(n)
            pairs += int(((i + window).clamp(max=n - 1) - (i - window).clamp(min=0) + 1).sum())
    return pairs


# The environment that makes every library of a run stand for a CPU of a lower level: fastbert's
# kernels (FASTBERT_CPU_CAPABILITY), torch's own (ATEN_CPU_CAPABILITY), MKL's GEMMs, oneDNN's (torch's
# int8 and bf16 products; a library past its cap computes what that CPU would, saturation included)
# and CTranslate2's. ONNX Runtime picks its kernels from cpuid and cannot be capped.
LEVEL_CAPS = {
    "scalar": dict(ATEN_CPU_CAPABILITY="default", MKL_ENABLE_INSTRUCTIONS="SSE4_2", ONEDNN_MAX_CPU_ISA="SSE41",
                   CT2_FORCE_CPU_ISA="GENERIC"),
    "avx2": dict(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2",
                 CT2_FORCE_CPU_ISA="AVX2"),
    "avx512": dict(ATEN_CPU_CAPABILITY="avx512", MKL_ENABLE_INSTRUCTIONS="AVX512", ONEDNN_MAX_CPU_ISA="AVX512_CORE",
                   CT2_FORCE_CPU_ISA="AVX512"),
}


def run_at_level(level: Optional[str], argv: List[str]) -> None:
    """Re-run this process with every library capped at `level` (LEVEL_CAPS), unless it already is:
    the caps take effect only when the libraries load."""
    import os
    import sys

    if level is None or os.environ.get("FASTBERT_CPU_CAPABILITY") == level:
        return
    if level not in LEVEL_CAPS:
        raise SystemExit(f"--cpu-capability: choose one of {sorted(LEVEL_CAPS)}, got {level!r}")
    env = dict(os.environ, FASTBERT_CPU_CAPABILITY=level, **LEVEL_CAPS[level])
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *argv], env)


def machine_info() -> dict:
    import os
    import platform

    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "fastbert_cpu_level": fastbert.backend.cpu_capability(),
        "processor": _cpu_name(),
        "cpu_flags": _cpu_flags(),
    }
    caps = {k: os.environ[k] for k in ("FASTBERT_CPU_CAPABILITY", *LEVEL_CAPS["avx2"]) if k in os.environ}
    if caps:
        info["capped"] = caps
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        pass
    return info


# the instruction-set extensions that decide which GEMM and elementwise kernels are fastest
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16", "amx_int8")


def _cpu_flags() -> List[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in _CPU_FLAGS if flag in have]
    except OSError:
        pass
    return []


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
