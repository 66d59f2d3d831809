"""A model's inference layers on the Triton kernels, launched from C++ (fastbert._C's post_ln_stack
for BERT's post-LN layers, pre_ln_stack for ModernBERT's pre-LN ones): the route
fastbert.ops.encoder.layers_forward and prenorm_layers_forward take first on a GPU.

In Python a BERT layer's four GEMMs and four kernels cost the host some 60-100 us beyond the
operations themselves (the launchers' arguments, the JIT's specialization of them, the calls in
between: benchmarks/RESULTS.md). Here the whole stack is one call: the GEMMs through ATen, each
kernel's launch packed in C++ and handed to the driver's cuLaunchKernelEx, exactly the launches the
Python route makes (the same compiled kernels, arguments, grids and stream; tests/ops/test_cuda_stack.py
compares them byte by byte through a stand-in driver).

What the C++ launches is learnt from the Python route, never written twice: for each kind of stack
(device, dtype, sizes, layout) a LaunchProgram holds, per launch of a layer (post-LN: every layer
alike) or of the whole stack (pre-LN: its layers differ), the compiled variants
the JIT made, each with the classes of argument values it was compiled for (an int's width and
divisibility by 16, a pointer's dtype and alignment). A call whose values fall in a class no variant
was registered for gets [] from the C++, runs the Python route with its launches recorded
(kernels.launches_recorded) and registers them; the next such call launches from C++. A stack the
C++ does not take (a relative bias, layers that differ in heads, GELU form, widths or biases, a
launch a plain cuLaunchKernelEx does not make, no CUDA driver loaded) runs in Python, decided once
per kind. Nothing is derived from the weights: they are the call's arguments.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Dict, Iterator, List, Optional, Sequence

import torch

from fastbert import backend as fb_backend
from fastbert.kernels import cdiv, driver_launch_address, launch_target, launches_recorded, sink

Tensor = torch.Tensor

RANGES, ATTENTION, NORM, GELU, NORM_SUM, GEGLU = range(6)  # the roles of csrc/launch_program.h, in its order
_PROGRAMS: Dict[tuple, Optional[list]] = {}  # kind of stack -> [program, registered?] or None (Python only)
_NAMES: list = []  # each role's value names, read from the extension once
_PYTHON_ONLY = contextvars.ContextVar("fastbert_cuda_stack_off", default=False)


@contextlib.contextmanager
def python_route() -> Iterator[None]:
    """Within the block the layers run their Python route (what this one is measured and checked
    against: benchmarks/bench_launch.py, tests/ops/test_cuda_stack.py)."""
    token = _PYTHON_ONLY.set(True)
    try:
        yield
    finally:
        _PYTHON_ONLY.reset(token)


def stack(x: Tensor, shape, layers: Sequence[tuple], mask: Optional[Tensor], cu_seqlens: Optional[Tensor],
          max_seqlen: Optional[int], keep_states: bool, run_python) -> Optional[List[Tensor]]:
    """The post-LN layers `layers` ((LayerWeights, heads, eps, GELU form) each) on the rows x [rows,
    width] (contiguous) of a hidden state of shape `shape`, launched from C++ -> the output rows of
    every layer (keep_states) or of the last; where a launch had no registered variant, run_python()
    (the Python route, which returns the same) runs with its launches recorded and registered. None
    where this route does not take the stack (the caller's own route runs)."""
    if not driver_launch_address() or _PYTHON_ONLY.get() or not layers:
        return None
    seq = _seq(x, shape, cu_seqlens, max_seqlen)
    first, heads, _, form = layers[0]
    widths = (x.shape[1], first.ffn_in_weight.shape[0])
    for w, h, _, f in layers:
        if h != heads or f != form or w.ffn_in_weight.shape[0] != widths[1] or any(t is None for t in w):
            return None
    target = launch_target()
    if seq is None or target is None:
        return None
    # the post-LN layers' launches, alike in every layer: the program holds one layer's (the compiled
    # kernels are the current device's)
    key = ("post", target[0], x.device, x.dtype, widths, heads, form, _layout(mask, cu_seqlens, seq))
    roles = ([RANGES] if mask is not None else []) + [ATTENTION, NORM, GELU, NORM]

    def launched(program, stream):
        weights = [t for w, *_ in layers for t in w]
        eps = [float(e) for _, _, pair, _ in layers for e in pair]
        return fb_backend.cpp_function("post_ln_stack")(program, x, weights, eps, heads, mask, cu_seqlens, seq,
                                                        sink(heads * x.shape[0], x.device), stream, keep_states)

    return _run(key, roles, len(layers), x, heads, seq, cu_seqlens, target[1], launched, run_python)


def prenorm_stack(x: Tensor, shape, layers: Sequence[tuple], mask: Optional[Tensor], cu_seqlens: Optional[Tensor],
                  max_seqlen: Optional[int], run_python) -> Optional[List[Tensor]]:
    """The pre-LN layers `layers` ((PreNormLayerWeights, heads, eps, GeGLU form, rotary base, window)
    each, layer 0 without an attention norm, every later one with one) on the rows x of a hidden state
    of shape `shape`, launched from C++ -> [stream, delta] after the last layer (rows), as
    fastbert.ops.encoder.prenorm_layers_forward's route gives them; misses and None as stack's."""
    from fastbert.ops.attention import rotary_for  # the rotary tables the Python route reads

    if not driver_launch_address() or _PYTHON_ONLY.get() or not layers:
        return None
    seq = _seq(x, shape, cu_seqlens, max_seqlen)
    heads, form = layers[0][1], layers[0][3]
    target = launch_target()
    if seq is None or target is None or any(h != heads or f != form for _, h, _, f, _, _ in layers):
        return None
    # every launch of the stack (layers differ: the first has no attention norm, a window reaches past the
    # longest sequence or not, a bias or a norm's bias is there or not), each with its own variants
    windows = tuple(window if 0 <= window < seq - 1 else -1 for *_, window in layers)  # as the attention takes them
    present = tuple(tuple(t is not None for t in w) for w, *_ in layers)
    widths = tuple(tuple(t.shape[0] for t in (w.qkv_weight, w.ffn_in_weight)) for w, *_ in layers)
    key = ("pre", target[0], x.device, x.dtype, x.shape[1], heads, form, windows, present, widths,
           _layout(mask, cu_seqlens, seq))
    layer = ([NORM_SUM] + ([RANGES] if mask is not None else []) + [ATTENTION, NORM_SUM, GEGLU])
    roles = layer[1:] + layer * (len(layers) - 1)

    def launched(program, stream):
        weights = [t for w, *_ in layers for t in w]
        eps = [float(e) for _, _, pair, *_ in layers for e in pair]
        tables: dict = {}
        ropes = []
        for *_, base, _ in layers:
            pair = tables.get(base)
            if pair is None:
                pair = tables[base] = rotary_for(float(base), x.shape[1] // heads, seq, x.device)
            ropes.extend(pair)
        return fb_backend.cpp_function("pre_ln_stack")(program, x, weights, eps, heads, ropes, mask, cu_seqlens, seq,
                                                       sink(heads * x.shape[0], x.device), stream)

    return _run(key, roles, 1, x, heads, seq, cu_seqlens, target[1], launched, run_python)


def forget() -> None:
    """Drop every program (their compiled kernels' handles): for a driver whose loaded kernels are let
    go of (fastbert.bench.launch's stand-in, at its end)."""
    _PROGRAMS.clear()


def _seq(x, shape, cu_seqlens, max_seqlen) -> Optional[int]:
    # the attention's sequence length, or None where the launchers take the problem unbound (one row or
    # one position) or the route is being traced
    seq = max_seqlen if cu_seqlens is not None else shape[1]
    if seq is None or seq <= 1 or x.shape[0] <= 1 or torch.compiler.is_compiling():
        return None
    return seq


def _layout(mask, cu_seqlens, seq) -> tuple:
    if cu_seqlens is not None:
        return ("varlen", cu_seqlens.dtype)
    if mask is not None:
        return ("masked", mask.dtype)
    return ("padded", min(seq & -seq, 256))  # the attention's even tiles or not: a kernel of its own


def _run(key, roles, repeats: int, x, heads: int, seq: int, cu_seqlens, stream: int, launched, run_python):
    # launched(program, stream) from C++ where the kind's program has its variants, else run_python()
    # recorded and registered (the kind marked Python only where its launches are not the program's)
    entry = _PROGRAMS.get(key, False)
    if entry is False:
        entry = _PROGRAMS[key] = _program(roles)
    if entry is None:
        return None
    program, registered = entry
    if registered:
        outs = launched(program, stream)
        if outs:
            return outs
    with launches_recorded() as record:
        outs = run_python()
    batch = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else x.shape[0] // seq
    if _register(program, roles, record, repeats, x.shape[0], batch, heads, seq):
        entry[1] = True
    else:
        _PROGRAMS[key] = None
    return outs


def _program(roles) -> Optional[list]:
    address = driver_launch_address()
    make = fb_backend.cpp_function("LaunchProgram") if address else None
    if make is None:
        return None
    if not _NAMES:
        _NAMES.extend(fb_backend.cpp_function("launch_role_names")())
    return [make(address, roles), False]


def _register(program, roles, record: list, repeats: int, rows: int, batch: int, heads: int, seq: int) -> bool:
    """Register the recorded launches of the Python route's run with `program` (launch i of the run is
    the program's launch i % len(roles), its role roles[i % len(roles)]; the run is `repeats` times
    the program's launches); False where they are not the program's (their count, a launch no plain
    cuLaunchKernelEx makes, a varying argument the C++ does not compute, a grid off the role's rule)."""
    if len(record) != len(roles) * repeats:
        return False
    for i, (bound, grid, args) in enumerate(record):
        position = i % len(roles)
        role = roles[position]
        found = bound.variant(args)
        if found is None:
            return False
        function, threads, shared, forms = found
        names = _NAMES[role]
        kinds, value_kinds, tensors, ints, floats, slots = [], [], [], [], [], []
        for kind, value, name in forms:
            if name is not None and name not in names:
                return False
            kinds.append(kind)
            slots.append(-1 if name is None else names.index(name))
            tensors.append(value if isinstance(value, Tensor) else None)
            ints.append(int(value) if isinstance(value, (bool, int)) else 0)
            floats.append(float(value) if isinstance(value, float) else 0.0)
            value_kinds.append(0 if value is None else 1 if isinstance(value, Tensor) else
                               2 if isinstance(value, (bool, int)) else 3 if isinstance(value, float) else -1)
            if value_kinds[-1] < 0:
                return False
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block_m = bound.options.get("BLOCK_M", 1)
        if role == RANGES:
            expected = (batch, 1, 1)
        elif role == ATTENTION:
            expected = (cdiv(seq, block_m), heads, batch)
        elif role in (GELU, GEGLU):
            expected = (cdiv(rows, block_m), grid[1], 1)
        else:
            expected = (cdiv(rows, block_m), 1, 1)
        if grid != expected:
            return False
        if not program.add(position, function, threads, shared, "".join(kinds), value_kinds, tensors, ints, floats,
                           slots, block_m, grid[1] if role in (GELU, GEGLU) else 1):
            return False
    return True
