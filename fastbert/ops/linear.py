"""linear(x, weight, bias) = x @ weight^T + bias, as F.linear, for the model's projections.

On the CPU every product runs on the GEMM path measured fastest for its shape (fastbert.ops.gemm):
the forward, and under autograd the input and weight gradients too, each timed and chosen on its
own. Under autocast the operands are cast to the autocast dtype first, as autocast casts F.linear's.

For inference the output of 4 MiB or more of the torch.addmm path comes from the C++ extension's
reusing mapping allocator instead of malloc: glibc maps such a block afresh on every call and the
GEMM then page-faults it in 4 KiB at a time (at 8982 x 1536 fp32 that took 44 ms a call against
31 ms into a reused buffer; the bias an addmm first copies into its output pays the faults too).
Off the CPU, while compiling, for empty inputs and for dtypes other than fp32, bf16 and fp16:
F.linear.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from fastbert import backend as _backend
from fastbert.ops import gemm

_GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class _Linear(torch.autograd.Function):
    """x2 [tokens, in] @ weight^T + bias, with each of the three products on its measured path."""

    @staticmethod
    def forward(ctx, x2, weight, bias):
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return gemm.product("fwd", x2, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = gemm.product("dx", dy, weight.t()) if ctx.needs_input_grad[0] else None
        dw = gemm.product("dw", dy.t(), x2.t()) if ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def _plain(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether F.linear is the path: off the CPU, while torch.compile traces, nothing to compute,
    or dtypes the GEMM paths do not take."""
    return (
        x.device.type != "cpu" or x.numel() == 0 or torch.compiler.is_compiling()
        or x.dtype not in _GEMM_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype)
    )


def _autocast_operands(x, weight, bias):
    """The operands in the CPU autocast dtype, as autocast casts them for F.linear."""
    dtype = torch.get_autocast_dtype("cpu")
    if not x.is_floating_point():
        return x, weight, bias
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T + bias [out] -> [..., out] (F.linear's values)."""
    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling():
        x, weight, bias = _autocast_operands(x, weight, bias)
        with torch.autocast("cpu", enabled=False):
            return linear(x, weight, bias)
    if _plain(x, weight, bias):
        return F.linear(x, weight, bias)
    shape = (*x.shape[:-1], weight.shape[0])
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _Linear.apply(x2, weight, bias).view(shape)
    empty = _backend.cpp_function("empty")
    alloc = None if empty is None else (lambda: empty([x2.shape[0], weight.shape[0]], x.dtype))
    return gemm.product("fwd", x2, weight, bias, alloc).view(shape)
