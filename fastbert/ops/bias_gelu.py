"""bias + GELU: gelu(x + bias) over the last dim, fused into one pass.

Layers, top to bottom: custom ops (opaque to torch.compile) -> autograd Function -> functional API.
The kernels themselves live in kernels/bias_gelu.py (Triton) and csrc/bias_gelu.cpp (C++).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from fastbert import backend as fb_backend
from fastbert import reference
from fastbert.ops.checks import check_approximate, check_float, check_vector
from fastbert.ops.common import as_rows, fused_op, needs_grad

# transformers' hidden_act names of the GELU forms -> `approximate` of bias_gelu ("none": exact erf)
GELU_FORMS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def _fake_fwd(x, bias, approximate, backend):
    return torch.empty_like(x)


@fused_op("bias_gelu_fwd", _fake_fwd)
def bias_gelu_fwd(x: torch.Tensor, bias: torch.Tensor, approximate: str, backend: str) -> torch.Tensor:
    # x: [rows, hidden] contiguous, bias: [hidden] -> y: [rows, hidden] in x.dtype
    return fb_backend.impl(backend, "bias_gelu").bias_gelu_forward(x, bias, approximate)


def _fake_bwd(dy, x, bias, approximate, backend):
    return torch.empty_like(x), torch.empty_like(bias)


@fused_op("bias_gelu_bwd", _fake_bwd)
def _bias_gelu_bwd(
    dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str, backend: str
) -> Tuple[torch.Tensor, torch.Tensor]:
    # dy, x: [rows, hidden] -> dx: [rows, hidden] in x.dtype, dbias: [hidden] in bias.dtype (fp32 sums)
    return tuple(fb_backend.impl(backend, "bias_gelu").bias_gelu_backward(dy, x, bias, approximate))


class BiasGeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, approximate, backend):
        ctx.save_for_backward(x, bias)
        ctx.approximate, ctx.backend = approximate, backend
        return bias_gelu_fwd(x, bias, approximate, backend)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, dbias = _bias_gelu_bwd(dy.contiguous(), x, bias, ctx.approximate, ctx.backend)
        return dx, dbias, None, None


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", *, backend: Optional[str] = None
) -> torch.Tensor:
    """gelu(x + bias) over the last dim of x, forward and backward each one fused pass.

    x: [..., hidden] float32/float16/bfloat16 (any layout; non-contiguous inputs are copied);
    bias: [hidden], x's dtype or float32. approximate: "none" (exact erf GELU, what BERT checkpoints
    use) or "tanh". Returns [..., hidden] in x's dtype. The bias gradient is reduced in float32.
    backend: "triton", "cpp", "torch" or None (automatic; see fastbert.backend).
    """
    check_float("bias_gelu", "x", x)
    if x.dim() == 0:
        raise ValueError("fastbert.ops.bias_gelu: x must have at least one dim (the hidden size)")
    check_vector("bias_gelu", "bias", bias, x)
    check_approximate("bias_gelu", approximate)
    backend = fb_backend.resolve(backend, x)
    if backend == "torch" or x.numel() == 0:
        return reference.bias_gelu(x, bias, approximate)
    rows, bias = as_rows(x), bias.contiguous()
    if needs_grad(x, bias):
        return BiasGeluFunction.apply(rows, bias, approximate, backend).view(x.shape)
    return bias_gelu_fwd(rows, bias, approximate, backend).view(x.shape)
