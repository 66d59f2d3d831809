"""bias + GELU: gelu(x + bias), the exact erf form or the tanh approximation."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias) over the last dim; "none" is the exact erf form, "tanh" the approximation."""
    return F.gelu(x + bias.to(x.dtype), approximate=approximate)


class BiasGelu(nn.Module):
    def __init__(self, hidden: int, approximate: str = "none"):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.approximate = approximate

    def forward(self, x):
        return bias_gelu(x, self.bias, self.approximate)
