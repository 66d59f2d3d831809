"""The CPU GEMM paths of the model's linear layers, and the choice between them by measurement.

Every product the linear layers need has the form of a linear layer, y [R, C] = a [R, I] @ b [C, I]^T
(+ bias [C]):

    role "fwd"  the forward     a = x [tokens, in],    b = weight [out, in]        -> y  [tokens, out]
    role "dx"   input gradient  a = dy [tokens, out],  b = weight^T [in, out]      -> dx [tokens, in]
    role "dw"   weight gradient a = dy^T [out, tokens], b = x^T [in, tokens]       -> dw [out, in]

Paths (those this torch build offers; each probed once against a float64 product and dropped when
it raises or disagrees, with one warning in fp32 and bf16; `unavailable()` says why): addmm, onednn,
onednn_packed, mkl_packed, dot and fp32 for float products; fastbert, int_mm, onednn_qlinear and
float for int8 inference (a and b int8, role fwd, no bias: the int32 accumulator acc = a @ b^T, whose
dequantization the consuming op applies, see fastbert.ops.int8). fastbert.ops.gemm_paths runs them
and says what each is.

Which is fastest depends on the CPU (its vector width, AMX, the library's kernels for it), the shape
and the thread count, so it is measured, never assumed: the first product of each (role, token
bucket, in, out, dtype, threads, kernel level) runs every path on the real operands, times each, and
the fastest is used from then on in this process (`choices()` shows what was timed and chosen). Token counts are
bucketed by powers of two (variable-length batches share a few measurements); products over 2048 tokens
are timed on their first 2048 (TIMING_TOKENS), where the paths' large-product kernels already run.

The packed paths reorder the weight on every call and the reorder is part of what is timed: a cached
packed copy could go stale unseen (an in-place write through `weight.data` moves no version counter),
so none is kept, and packing wins only where it pays for its own reorder. (An int8 layer can store
its weight packed instead, as its only copy: fastbert.ops.int8.int8_layout.)

FASTBERT_GEMM=<path> (or `forced(path)`) runs every product on one path, for comparisons.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from fastbert import backend as fb_backend
from fastbert.ops import gemm_paths, gemm_timing
from fastbert.ops.gemm_paths import Alloc

Tensor = torch.Tensor
ROLES = ("fwd", "dx", "dw")
FLOAT_PATHS = ("addmm", "onednn", "onednn_packed", "mkl_packed", "dot", "fp32")
INT8_PATHS = ("fastbert", "int_mm", "onednn_qlinear", "float")
PATHS = FLOAT_PATHS + INT8_PATHS
_choices: Dict[tuple, Tuple[str, Dict[str, float]]] = gemm_timing.cache()
_probed: Dict[Tuple[str, str, torch.dtype], Optional[str]] = gemm_timing.cache()  # why a path is not used, or None
_forced: List[Optional[str]] = [None]


def _fp32(role: str, a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    if a.dtype == torch.float32:
        raise TypeError("the fp32 path takes bf16 and fp16 products")
    y = product(role, a.float(), b.float(), None if bias is None else bias.float())
    return y.to(a.dtype) if alloc is None else alloc().copy_(y)


def _float_int8(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    return product("fwd", a.float(), b.float())


# path -> the function that runs a product on it, (a, b, bias, alloc) -> a @ b^T (+ bias): the one table
# call() finds a path's function in, so an entry replaced here is what every product on that path runs
RUN: Dict[str, Callable] = {
    "addmm": gemm_paths.addmm, "onednn": gemm_paths.onednn, "onednn_packed": gemm_paths.onednn_packed,
    "mkl_packed": gemm_paths.mkl_packed, "dot": gemm_paths.dot, "fastbert": gemm_paths.fastbert_int8,
    "int_mm": gemm_paths.int_mm, "onednn_qlinear": gemm_paths.onednn_qlinear, "float": _float_int8}


def call(path: str, role: str, a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    """a @ b^T (+ bias) on `path`."""
    if path == "fp32":
        return _fp32(role, a, b, bias, alloc)
    return RUN[path](a, b, bias, alloc)


def _tolerance(dtype: torch.dtype, inner: int) -> float:
    eps = {torch.float32: 1.2e-7, torch.bfloat16: 7.8e-3, torch.float16: 9.8e-4}.get(dtype, 1e-2)
    return 8 * eps * inner ** 0.5


def _probe(path: str, role: str, dtype: torch.dtype) -> bool:
    """Run `path` once on a small product against float64; False if it is missing, raises or
    disagrees. A failure in fp32 or bf16 is warned of once (an underscored op that changed between
    torch releases); in fp16, and in bf16 on a CPU without native bf16, it is usual (the CPU lacks
    the instructions) and only recorded."""
    key = (path, role, dtype)
    if key not in _probed:
        why = None if gemm_paths.offered(path, role, dtype) else "not offered for this role and dtype on this build"
        if why is None and path != "addmm":
            why = _probe_run(path, role, dtype)
            usual = dtype == torch.float16 or (dtype == torch.bfloat16 and fb_backend.native_bf16() is False)
            if why is not None and dtype in (torch.float32, torch.bfloat16) and not usual:
                warnings.warn(f"fastbert.ops.linear: GEMM path {path!r} ({role}, {dtype}) is not used: {why}",
                              stacklevel=3)
        _probed[key] = why
    return _probed[key] is None


def _int8_agrees(path: str, got: Tensor, want: Tensor) -> bool:
    """Whether an int8 path's accumulator is the exact product `want` (the float path: within fp32's
    rounding of it)."""
    if tuple(got.shape) != tuple(want.shape):
        return False
    if path == "float":
        return bool(((got.double() - want.double()).abs() <= 6e-8 * want.double().abs()).all())
    return bool((got.double() == want.double()).all())


def _exact_int8(paths: List[str], a: Tensor, b: Tensor) -> List[str]:
    """The int8 paths whose result on these operands is exact, checked against fastbert's kernel
    (exact by construction) or the int64 product: a library's kernel for one shape can differ from
    its kernel for the shape its probe ran (oneDNN's int8 kernels without VNNI saturate 16-bit pair
    sums). A path that disagrees is dropped for good, and fastbert.ops.gemm.unavailable() says why."""
    want = call("fastbert", "fwd", a, b, None, None) if "fastbert" in paths else a.long() @ b.long().t()
    kept = []
    for path in paths:
        if path == "fastbert" or _int8_agrees(path, call(path, "fwd", a, b, None, None), want):
            kept.append(path)
        else:
            _probed[(path, "fwd", torch.int8)] = (f"its result disagreed with the exact integer product on a "
                                                  f"[{a.shape[0]} x {a.shape[1]}] x [{b.shape[1]} x {b.shape[0]}] product")
    return kept


def _probe_run(path: str, role: str, dtype: torch.dtype) -> Optional[str]:
    """None when `path` computes a small product right, else why not."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.int8:
        # a small product, and one large enough for a library's optimized kernels whose values make
        # 16-bit pair sums saturate (a = 127 is 255 as u8; u8 x s8 pairs of 255 x 127 overflow int16)
        big_b = torch.full((96, 768), 127, dtype=torch.int8)
        big_b[1::2] = -128
        cases = [tuple(torch.randint(-128, 128, s, generator=g, dtype=torch.int8) for s in ((37, 24), (40, 24))),
                 (torch.full((128, 768), 127, dtype=torch.int8), big_b)]
        for a, b in cases:
            try:
                got = call(path, role, a, b, None, None)
            except Exception as e:  # a missing or changed underscored op
                return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if not _int8_agrees(path, got, a.long() @ b.long().t()):
                return "its result disagrees with the exact integer product"
        return None
    a, b, bias = (torch.randn(*s, generator=g).to(dtype) for s in ((37, 24), (40, 24), (40,)))
    if role != "fwd":  # the gradient products come transposed, as the layer passes them
        a, b, bias = a.t().contiguous().t(), b.t().contiguous().t(), None
    try:
        got = call(path, role, a, b, bias, None).double()
    except Exception as e:  # a missing or changed underscored op, or a CPU without the instructions
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    want = a.double() @ b.double().t() + (0 if bias is None else bias.double())
    if tuple(got.shape) != tuple(want.shape) or not bool(
            ((got - want).abs() <= _tolerance(dtype, 24) * (1 + want.abs())).all()):
        return "its result disagrees with the float64 product"
    return None


def _default(dtype: torch.dtype) -> str:
    """The path a product takes when a forced one does not apply: torch.addmm for floats (taken
    without a probe: torch's own product), for int8 fastbert's kernel, else the float path (every
    int8 path is probed: a library's int8 kernel without VNNI may saturate)."""
    if dtype != torch.int8:
        return "addmm"
    return "fastbert" if _probe("fastbert", "fwd", dtype) else "float"


def unavailable() -> Dict[Tuple[str, str, torch.dtype], str]:
    """{(path, role, dtype): why it is not used} for the paths probed so far (and the int8 paths too
    slow to time at the current threads and kernel level)."""
    out = {k: why for k, why in _probed.items() if why is not None}
    slow = _slow.get(gemm_timing.here(), {})
    out.update({(p, "fwd", torch.int8): why for p, why in slow.items()})
    return out


def _paths_for(dtype: torch.dtype) -> Tuple[str, ...]:
    return INT8_PATHS if dtype == torch.int8 else FLOAT_PATHS


def candidates(role: str, dtype: torch.dtype) -> List[str]:
    """The paths that take `role` in `dtype` on this build and passed their probe (int8: and are not
    SLOW_INT8 times slower than the fastest here)."""
    paths = [p for p in _paths_for(dtype) if _probe(p, role, dtype)]
    return _fast_enough(paths) if dtype == torch.int8 and len(paths) > 1 else paths


SLOW_INT8 = 8.0
_slow: Dict[tuple, Dict[str, str]] = gemm_timing.cache()  # (threads, kernel level) -> {int8 path: why it is not timed}


def _fast_enough(paths: List[str]) -> List[str]:
    """The int8 paths within SLOW_INT8 of the fastest on a [256 x 768] x [768 x 768] product, timed once
    per (threads, kernel level): the others would slow the first product of every shape and never
    win it (torch._int_mm runs a scalar loop on CPUs without VNNI: benchmarks/LOG.md, "First call",
    on a Zen 3). unavailable() says how much slower the others were."""
    key = gemm_timing.here()
    if key not in _slow:
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (256, 768), generator=g, dtype=torch.int8)
        b = torch.randint(-127, 128, (768, 768), generator=g, dtype=torch.int8)
        timings = gemm_timing.time_paths(paths, lambda p: call(p, "fwd", a, b, None, None))
        best = min(timings, key=timings.get)
        _slow[key] = {p: f"{t / timings[best]:.0f}x slower than {best} on a [256 x 768] x [768 x 768] product, so not timed"
                      for p, t in timings.items() if t > SLOW_INT8 * timings[best]}
    return [p for p in paths if p not in _slow[key]]


def bucket(tokens: int) -> int:
    """The token bucket a product of `tokens` tokens is measured in: the power of two at or above it."""
    return 1 << max(tokens - 1, 0).bit_length()


def _key(role: str, a: Tensor, b: Tensor) -> tuple:
    """(role, token bucket, in_features, out_features, dtype, threads, kernel level) of a product."""
    if role == "fwd":
        tokens, n_in, n_out = a.shape[0], a.shape[1], b.shape[0]
    elif role == "dx":
        tokens, n_in, n_out = a.shape[0], b.shape[0], a.shape[1]
    else:
        tokens, n_in, n_out = a.shape[1], b.shape[0], a.shape[0]
    return _key_of(role, tokens, n_in, n_out, a.dtype, gemm_timing.here())


def _key_of(role: str, tokens: int, n_in: int, n_out: int, dtype: torch.dtype,
            here: Tuple[int, Optional[str]]) -> tuple:
    """The key of a product by its sizes, `here` being gemm_timing.here() (read once by a caller with several)."""
    return (role, bucket(tokens), n_in, n_out, dtype, *here)


def forced_name() -> Optional[str]:
    """The path every product is forced onto (forced() or FASTBERT_GEMM), or None."""
    return _forced[-1] or os.environ.get("FASTBERT_GEMM") or None


def _forced_choice(forced: str, role: str, dtype: torch.dtype) -> str:
    """The path a product runs under the forced path `forced` (one of PATHS): it, where it takes this
    role and dtype and passed its probe, else the dtype's default."""
    return forced if forced in _paths_for(dtype) and _probe(forced, role, dtype) else _default(dtype)


def product(role: str, a: Tensor, b: Tensor, bias: Optional[Tensor] = None, alloc: Alloc = None) -> Tensor:
    """a @ b^T (+ bias) on the path measured fastest for this role and shape (see the module
    docstring). `alloc`, when given, makes the output for the paths that can write into one."""
    forced = forced_name()
    if forced is not None:
        if forced not in PATHS:
            raise ValueError(f"fastbert: FASTBERT_GEMM={forced!r} is not a GEMM path; choose from {PATHS}")
        return call(_forced_choice(forced, role, a.dtype), role, a, b, bias, alloc)
    key = _key(role, a, b)
    chosen = _choices.get(key)
    if chosen is not None:
        return call(chosen[0], role, a, b, bias, alloc)
    paths = candidates(role, a.dtype)
    if a.dtype == torch.int8:  # exactness on every operand value, timing on the first tokens
        paths = _exact_int8(paths, a, b)
    ta, tb = _timing_operands(role, a, b)
    sliced = ta is not a or tb is not b
    timings = gemm_timing.time_paths(paths, lambda p: call(p, role, ta, tb, bias, None if sliced else alloc))
    best = min(timings, key=timings.get)
    _choices[key] = (best, timings)
    if best in ("float", "fp32"):
        _say_fp32_wins(key, timings)
    return call(best, role, a, b, bias, alloc)


def path_for(role: str, tokens: int, n_in: int, n_out: int, dtype: torch.dtype) -> Optional[str]:
    """The path product() takes for a product of this role, token count, shape and dtype, when known
    without running one: the forced path, or the one measured for its key; None before the key's
    first product (which measures) or under an unknown forced path (which product() reports)."""
    forced = forced_name()
    if forced is not None:
        return _forced_choice(forced, role, dtype) if forced in PATHS else None
    chosen = _choices.get(_key_of(role, tokens, n_in, n_out, dtype, gemm_timing.here()))
    return None if chosen is None else chosen[0]


def layer_paths(rows: int, weights, dtype: torch.dtype, ids: Dict[str, int]) -> Optional[List[int]]:
    """The ids (ids: {path: id}) of the paths that forward products of `rows` rows with these [out, in]
    weights take, known without running one (path_for's answer for each; gemm_timing.here() read once; an int8
    weight stored packed: "packed"); None while one is not measured yet or is not in ids."""
    forced, here = forced_name() is not None, gemm_timing.here()
    paths = []
    for w in weights:
        if w.dim() == 4:
            paths.append("packed")
        elif forced:
            paths.append(path_for("fwd", rows, w.shape[1], w.shape[0], dtype))
        else:
            chosen = _choices.get(_key_of("fwd", rows, w.shape[1], w.shape[0], dtype, here))
            paths.append(None if chosen is None else chosen[0])
    if not all(p in ids for p in paths):
        return None
    return [ids[p] for p in paths]


TIMING_TOKENS = 2048  # larger products are timed on their first 2048 tokens


def _timing_operands(role: str, a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor]:
    """The operands the paths are timed on: the first TIMING_TOKENS tokens of a larger product (rows
    of a for fwd and dx, the inner dimension for dw), where the ranking of the paths holds already."""
    if role == "dw":
        return (a, b) if a.shape[1] <= TIMING_TOKENS else (a[:, :TIMING_TOKENS], b[:, :TIMING_TOKENS])
    return (a, b) if a.shape[0] <= TIMING_TOKENS else (a[:TIMING_TOKENS], b)


_said: Dict[torch.dtype, bool] = {}


def _say_fp32_wins(key: tuple, timings: Dict[str, float]) -> None:
    """One warning per dtype and process: an int8 or bf16 / fp16 product runs in fp32, because no
    product in its own dtype beats fp32 on this CPU."""
    role, tokens, n_in, n_out, dtype, threads, level = key
    if _said.get(dtype):
        return
    _said[dtype] = True
    ms = ", ".join(f"{p} {t * 1e3:.2f} ms" for p, t in sorted(timings.items(), key=lambda kv: kv[1]))
    where = f"this CPU (fastbert kernel level {level}, {threads} threads)"
    shape = f"a [{tokens} x {n_in}] x [{n_in} x {n_out}] product ({role}: {ms})"
    if dtype == torch.int8:
        msg = (f"fastbert: no int8 GEMM on {where} beats fp32 for {shape}; int8 layers run such products in fp32, "
               "so quantize='int8' gains little speed here")
    else:
        name = str(dtype).removeprefix("torch.")
        native = fb_backend.native_bf16() and dtype == torch.bfloat16
        why = ("has native bf16 (AVX512_BF16) but no bfloat16 matrix product here faster than fp32" if native else
               f"has no fast {name} matrix product (native bf16 needs AVX512_BF16 or AMX)")
        msg = (f"fastbert: {where} {why}: "
               f"{shape}; {name} products run in fp32 here, so {name} (dtype={name}, autocast, Trainer(bf16=True)) "
               "saves memory but no time. For speed, run in float32, or quantize='int8' for inference")
    warnings.warn(msg + " (fastbert.ops.gemm.choices() has every shape)", RuntimeWarning, stacklevel=4)


def choices() -> Dict[tuple, Tuple[str, Dict[str, float]]]:
    """{(role, token bucket, in, out, dtype, threads): (chosen path, {path: seconds timed})}."""
    return dict(_choices)


def set_choices(table: Dict[tuple, Tuple[str, Dict[str, float]]]) -> None:
    """Replace the measured choices by `table`, as choices() returned it (a benchmark runs one table,
    then another, on the same model)."""
    _choices.clear()
    _choices.update(table)


def reset() -> None:
    """Forget the measured choices and probes (they are measured again at the next product)."""
    gemm_timing.forget()  # the paths' choices and probes, and int8's weight layout
    _said.clear()


@contextlib.contextmanager
def forced(path: Optional[str]) -> Iterator[None]:
    """Run every product on `path` inside the block (None: the measured choice)."""
    if path is not None and path not in PATHS:
        raise ValueError(f"fastbert: {path!r} is not a GEMM path; choose from {PATHS}")
    _forced.append(path)
    try:
        yield
    finally:
        _forced.pop()
