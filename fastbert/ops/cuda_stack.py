"""A model's post-LN inference layers on the Triton kernels, launched from C++ (fastbert._C's
post_ln_stack): the route fastbert.ops.encoder.layers_forward takes first on a GPU.

In Python a BERT layer's four GEMMs and four kernels cost the host some 60-100 us beyond the
operations themselves (the launchers' arguments, the JIT's specialization of them, the calls in
between: benchmarks/RESULTS.md). Here the whole stack is one call: the GEMMs through ATen, each
kernel's launch packed in C++ and handed to the driver's cuLaunchKernelEx, exactly the launches the
Python route makes (the same compiled kernels, arguments, grids and stream; tests/ops/test_cuda_stack.py
compares them byte by byte through a stand-in driver).

What the C++ launches is learnt from the Python route, never written twice: for each kind of stack
(device, dtype, sizes, layout) a LaunchProgram holds, per launch of a layer, the compiled variants
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

RANGES, ATTENTION, NORM, GELU = range(4)  # the roles of csrc/launch_program.h, in its order
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
    if not driver_launch_address() or _PYTHON_ONLY.get():
        return None
    key = _kind(x, shape, layers, mask, cu_seqlens, max_seqlen)
    if key is None:
        return None
    entry = _PROGRAMS.get(key, False)
    if entry is False:
        entry = _PROGRAMS[key] = _program(mask is not None)
    if entry is None:
        return None
    program, registered = entry
    heads = layers[0][1]
    seq = max_seqlen if cu_seqlens is not None else shape[1]
    if registered:
        _, stream = launch_target()
        weights = [t for w, *_ in layers for t in w]
        eps = [float(e) for _, _, pair, _ in layers for e in pair]
        outs = fb_backend.cpp_function("post_ln_stack")(program, x, weights, eps, heads, mask, cu_seqlens, seq,
                                                        sink(heads * x.shape[0], x.device), stream, keep_states)
        if outs:
            return outs
    with launches_recorded() as record:
        outs = run_python()
    batch = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else x.shape[0] // seq
    if not _register(program, record, len(layers), x.shape[0], batch, heads, seq, mask is not None):
        _PROGRAMS[key] = None
    else:
        entry[1] = True
    return outs


def _kind(x, shape, layers, mask, cu_seqlens, max_seqlen) -> Optional[tuple]:
    # what decides the layers' launches but the call's values (those the C++ classes), or None where the
    # C++ does not take the stack: the same heads, GELU form, widths and dtypes in every layer, every bias
    if not layers or torch.compiler.is_compiling():
        return None
    first, heads, _, form = layers[0]
    widths = (x.shape[1], first.ffn_in_weight.shape[0])
    for w, h, _, f in layers:
        if h != heads or f != form or w.ffn_in_weight.shape[0] != widths[1] or any(t is None for t in w):
            return None
    seq = max_seqlen if cu_seqlens is not None else shape[1]
    if seq is None or seq <= 1 or x.shape[0] <= 1:  # the attention's launchers take these, unbound
        return None
    if cu_seqlens is not None:
        layout = ("varlen", cu_seqlens.dtype)
    elif mask is not None:
        layout = ("masked", mask.dtype)
    else:  # the attention's even tiles or not: a kernel of its own
        layout = ("padded", min(seq & -seq, 256))
    return (x.device, x.dtype, widths, heads, form, layout)


def _program(masked: bool) -> Optional[list]:
    address = driver_launch_address()
    make = fb_backend.cpp_function("LaunchProgram") if address else None
    if make is None:
        return None
    if not _NAMES:
        _NAMES.extend(fb_backend.cpp_function("launch_role_names")())
    roles = ([RANGES] if masked else []) + [ATTENTION, NORM, GELU, NORM]
    return [make(address, roles), False]


def _register(program, record: list, n_layers: int, rows: int, batch: int, heads: int, seq: int, masked: bool) -> bool:
    """Register the recorded launches of the Python route's run with `program` (launch i of the run is
    launch i % len(program) of a layer); False where they are not the program's (their count, a
    launch no plain cuLaunchKernelEx makes, a grid off the program's rule)."""
    per_layer = len(program)
    if len(record) != per_layer * n_layers:
        return False
    roles = ([RANGES] if masked else []) + [ATTENTION, NORM, GELU, NORM]
    for i, (bound, grid, args) in enumerate(record):
        position = i % per_layer
        role = roles[position]
        found = bound.variant(args)
        if found is None:
            return False
        function, threads, shared, forms = found
        names = _NAMES[role]
        kinds, value_kinds, tensors, ints, floats, slots = [], [], [], [], [], []
        for kind, value, name in forms:
            if name is not None and name not in names:
                return False  # a varying argument the C++ does not compute
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
        elif role == GELU:
            expected = (cdiv(rows, block_m), grid[1], 1)
        else:
            expected = (cdiv(rows, block_m), 1, 1)
        if grid != expected:
            return False
        program.add(position, function, threads, shared, "".join(kinds), value_kinds, tensors, ints, floats, slots,
                    block_m, grid[1] if role == GELU else 1)
    return True
