"""linear(x, weight, bias) = x @ weight^T + bias, as F.linear, for the model's projections.

On the CPU every product runs on the GEMM path measured fastest for its shape (fastbert.ops.gemm):
the forward, and under autograd the input and weight gradients too, each timed and chosen on its
own. Under autocast the operands are cast to the autocast dtype first, as autocast casts F.linear's.

Outputs of 4 MiB or more of the torch.addmm path come from the C++ extension's
reusing mapping allocator instead of malloc: glibc maps such a block afresh on every call and the
GEMM then page-faults it in 4 KiB at a time (at 8982 x 1536 fp32 a sizable share of the call:
benchmarks/LOG.md, "What makes it fast, one choice undone at a time"; the bias an addmm first copies
into its output pays the faults too).
Off the CPU, on the "torch" and "triton" backends, while compiling, for empty inputs and for dtypes
other than fp32, bf16 and fp16: F.linear.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from fastbert import backend as fb_backend
from fastbert.ops import gemm

_GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _allocator(rows: int, cols: int, dtype: torch.dtype):
    """A maker of the [rows, cols] output in the extension's reusing allocator, or None without it."""
    empty = fb_backend.cpp_function("empty")
    return None if empty is None else (lambda: empty([rows, cols], dtype))


class _Linear(torch.autograd.Function):
    """x2 [tokens, in] @ weight^T + bias, with each of the three products on its measured path."""

    @staticmethod
    def forward(ctx, x2, weight, bias):
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return gemm.product("fwd", x2, weight, bias, _allocator(x2.shape[0], weight.shape[0], x2.dtype))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = gemm.product("dx", dy, weight.t(), None, _allocator(dy.shape[0], weight.shape[1], dy.dtype))
        if ctx.needs_input_grad[1]:
            dw = gemm.product("dw", dy.t(), x2.t(), None, _allocator(weight.shape[0], weight.shape[1], dy.dtype))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0)
        return dx, dw, db


def _plain(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], backend: Optional[str]) -> bool:
    """Whether F.linear is the path: off the CPU, on a backend other than "cpp" (the GEMM paths are
    the C++ backend's: "torch" is the plain reference, and "triton" on the CPU stands for the CUDA
    path), while torch.compile traces, nothing to compute, or dtypes the GEMM paths do not take."""
    return (
        x.device.type != "cpu" or backend not in (None, "cpp") or x.numel() == 0 or torch.compiler.is_compiling()
        or x.dtype not in _GEMM_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype)
    )


class _Cast(torch.autograd.Function):
    """t.to(dtype), the copy and its gradient's copy back both in memory from `empty` (the
    extension's reusing allocator): under autocast every weight is cast in the forward and its
    gradient cast back in the backward, each a fresh 4.7-9.4 MB block for BERT-base that malloc
    would map and page-fault anew at every step."""

    @staticmethod
    def forward(ctx, t, dtype, empty):
        ctx.dtype, ctx.empty = t.dtype, empty
        return empty(list(t.shape), dtype).copy_(t)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return ctx.empty(list(grad.shape), ctx.dtype).copy_(grad), None, None


def _autocast_operands(x, weight, bias):
    """The operands in the CPU autocast dtype, as autocast casts them for F.linear."""
    dtype = torch.get_autocast_dtype("cpu")
    if not x.is_floating_point():
        return x, weight, bias
    empty = fb_backend.cpp_function("empty")

    def cast(t):
        if t is None or t.dtype == dtype:
            return t
        return t.to(dtype) if empty is None else _Cast.apply(t, dtype, empty)

    return cast(x), cast(weight), cast(bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           backend: Optional[str] = None) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T + bias [out] -> [..., out] (F.linear's values). backend: None
    (automatic) or "cpp" run the measured GEMM paths on the CPU; "torch" and "triton" F.linear."""
    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling():
        x, weight, bias = _autocast_operands(x, weight, bias)
        with torch.autocast("cpu", enabled=False):
            return linear(x, weight, bias, backend=backend)
    if _plain(x, weight, bias, backend):
        return F.linear(x, weight, bias)
    shape = (*x.shape[:-1], weight.shape[0])
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _Linear.apply(x2, weight, bias).view(shape)
    return gemm.product("fwd", x2, weight, bias, _allocator(x2.shape[0], weight.shape[0], x.dtype)).view(shape)


def rows_forward(x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 backend: Optional[str] = None) -> torch.Tensor:
    """x2 [rows, in] @ weight^T + bias with nothing recorded for autograd and no checks: linear's
    product for callers that checked their operands and need no gradient (ops.encoder_layer)."""
    if backend == "triton" or _plain(x2, weight, bias, backend):
        # the product F.linear makes of rows (at::linear's own call), without its dispatch around it:
        # the same bits, a few microseconds less of the host's per product (benchmarks/bench_host.py)
        return torch.addmm(bias, x2, weight.t()) if bias is not None else torch.mm(x2, weight.t())
    return gemm.product("fwd", x2, weight, bias, _allocator(x2.shape[0], weight.shape[0], x2.dtype))
