"""GeGLU: gelu(a) * b, with a and b the two halves of one projection's last dim (ModernBERT's
feed-forward: Wi's output chunked in two, the first half activated, the second the gate); SwiGLU
the same with silu (NomicBERT's and EuroBERT's gate and up products, joined)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def geglu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x [..., 2d] -> gelu(x[..., :d]) * x[..., d:] [..., d]; "none" is the exact erf GELU."""
    a, b = x.chunk(2, dim=-1)
    return F.gelu(a, approximate=approximate) * b


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:] [..., d]."""
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


class GeGLU(nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return geglu(x, self.approximate)
