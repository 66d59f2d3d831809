"""Gated linear units, act(a) * b over the two halves a, b of x's last dim, fused into one pass each
way: GeGLU (act = GELU: ModernBERT, GTE) and SwiGLU (act = SiLU: NomicBERT, EuroBERT).

A gated feed-forward's first projection's output [..., 2d] goes in whole, [..., d] comes out;
neither half is copied. Layers, top to bottom: custom ops (opaque to torch.compile) -> autograd
Function -> functional API. The custom ops' `approximate` names the gate's activation: GELU's
"none" / "tanh", or "silu". The kernels live in kernels/geglu.py (Triton) and
csrc/kernels/geglu.cpp (C++).
"""
from __future__ import annotations

from typing import Optional

import torch

from fastbert import backend as fb_backend
from fastbert import reference
from fastbert.ops.checks import check_approximate, check_float
from fastbert.ops.common import as_rows, fused_op, needs_grad


def _fake_fwd(x, approximate, backend):
    return x.new_empty((x.shape[0], x.shape[1] // 2))


@fused_op("geglu_fwd", _fake_fwd)
def geglu_fwd(x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    # x: [rows, 2d] contiguous -> y: [rows, d] in x.dtype
    return fb_backend.impl(backend, "geglu").geglu_forward(x, approximate)


def _fake_bwd(dy, x, approximate, backend):
    return torch.empty_like(x)


@fused_op("geglu_bwd", _fake_bwd)
def _geglu_bwd(dy: torch.Tensor, x: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    # dy: [rows, d], x: [rows, 2d] -> dx: [rows, 2d] in x.dtype
    return fb_backend.impl(backend, "geglu").geglu_backward(dy, x, approximate)


class GegluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate, backend):
        ctx.save_for_backward(x)
        ctx.approximate, ctx.backend = approximate, backend
        return geglu_fwd(x, approximate, backend)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _geglu_bwd(dy.contiguous(), x, ctx.approximate, ctx.backend), None, None


def geglu(x: torch.Tensor, approximate: str = "none", *, backend: Optional[str] = None) -> torch.Tensor:
    """gelu(x[..., :d]) * x[..., d:] for x [..., 2d], forward and backward each one fused pass.

    x: float32/float16/bfloat16, any layout (non-contiguous inputs are copied), last dim even.
    approximate: "none" (exact erf GELU, ModernBERT's "gelu") or "tanh". Returns [..., d] in x's
    dtype. backend: "triton", "cpp", "torch" or None (automatic; see fastbert.backend).
    """
    check_float("geglu", "x", x)
    _check_halves("geglu", x)
    check_approximate("geglu", approximate)
    return _gated(x, approximate, backend)


def swiglu(x: torch.Tensor, *, backend: Optional[str] = None) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] for x [..., 2d] (SwiGLU: the gate first, as NomicBERT's and
    EuroBERT's joined gate / up products give it), forward and backward each one fused pass.

    x: float32/float16/bfloat16, any layout (non-contiguous inputs are copied), last dim even.
    Returns [..., d] in x's dtype. backend: "triton", "cpp", "torch" or None (automatic; see
    fastbert.backend).
    """
    check_float("swiglu", "x", x)
    _check_halves("swiglu", x)
    return _gated(x, "silu", backend)


def _check_halves(op: str, x: torch.Tensor) -> None:
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"fastbert.ops.{op}: x's last dim must be even (the two halves a and b), got shape "
                         f"{tuple(x.shape)}")


def _gated(x: torch.Tensor, approximate: str, backend: Optional[str]) -> torch.Tensor:
    backend = fb_backend.resolve(backend, x)
    if backend == "torch" or x.numel() == 0:
        return reference.swiglu(x) if approximate == "silu" else reference.geglu(x, approximate)
    shape = (*x.shape[:-1], x.shape[-1] // 2)
    rows = as_rows(x)
    if needs_grad(x):
        return GegluFunction.apply(rows, approximate, backend).view(shape)
    return geglu_fwd(rows, approximate, backend).view(shape)
