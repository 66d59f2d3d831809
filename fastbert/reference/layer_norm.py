"""dropout + residual add + LayerNorm, with fastbert's dropout rule (reference.philox)."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from fastbert.reference.philox import dropout_keep_mask, new_seed


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   eps: float = 1e-12,
                   dropout_p: float = 0.0, seed: Optional[int] = None,
                   keep_mask: Optional[torch.Tensor] = None,
                   return_sum: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """layer_norm(dropout(x) + residual) over the last dim, with the fastbert dropout rule.

    The mask comes from `keep_mask` when given, else from `seed` (an int or an int64 tensor of
    shape [1]; a fresh one when None). bias None: a LayerNorm without bias. return_sum: also the
    sum h = dropout(x) + residual the norm is taken of, as (layer_norm(h), h).
    """
    if dropout_p > 0.0:
        if keep_mask is None:
            keep_mask = dropout_keep_mask(new_seed() if seed is None else seed, x.shape, dropout_p, x.device)
        x = x * keep_mask.to(x.dtype) * (1.0 / (1.0 - dropout_p))
    h = x + residual
    y = F.layer_norm(h, (h.shape[-1],), weight.to(h.dtype), None if bias is None else bias.to(h.dtype), eps)
    return (y, h) if return_sum else y


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                 dropout_p: float = 0.0, seed: Optional[int] = None, keep_mask: Optional[torch.Tensor] = None,
                 return_sum: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """rms_norm(dropout(x) + residual) * weight over the last dim (torch.nn.RMSNorm's), with the
    fastbert dropout rule; the arguments of add_layer_norm, no bias."""
    if dropout_p > 0.0:
        if keep_mask is None:
            keep_mask = dropout_keep_mask(new_seed() if seed is None else seed, x.shape, dropout_p, x.device)
        x = x * keep_mask.to(x.dtype) * (1.0 / (1.0 - dropout_p))
    h = x + residual
    y = F.rms_norm(h, (h.shape[-1],), weight.to(h.dtype), eps)
    return (y, h) if return_sum else y


class AddLayerNorm(nn.Module):
    """BERT's BertSelfOutput / BertOutput tail: LayerNorm(dropout(x) + residual)."""

    def __init__(self, hidden: int, eps: float = 1e-12, dropout_p: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.eps = eps
        self.dropout_p = dropout_p

    def forward(self, x, residual, seed=None):
        p = self.dropout_p if self.training else 0.0
        return add_layer_norm(x, residual, self.weight, self.bias, self.eps, p, seed)
