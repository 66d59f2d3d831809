"""Attention that also returns its probabilities, for when they are asked for: softmax(q k^T *
scale + bias) v, spelled out in PyTorch (autograd through torch's own ops).

    attention_weights(q, k, v, bias=None, *, dropout_p=0.0, scale=None) -> (out, probs)
        q, k, v: [batch, heads, seq, head_dim]
        bias:    additive float mask broadcastable to [batch, heads, seq_q, seq_k] (0 where a query
                 may attend, -inf where not), or None
        out:     [batch, heads, seq, head_dim] in q's dtype; probs: [batch, heads, seq_q, seq_k] in q's
                 dtype, after dropout (as transformers' eager attention returns them)

The fused fastbert.ops.attention never forms the probabilities; this path is for users who want
them (output_attentions, attention maps) or whose mask is not a padding mask (a 3-D / 4-D mask that
differs between queries). A query whose keys are all masked gets zero probabilities, not NaN.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from fastbert.ops.checks import check_float


def attention_weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                      dropout_p: float = 0.0, scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    op = "attention_weights"
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(op, name, t)
        if t.dim() != 4:
            raise ValueError(f"fastbert.ops.{op}: {name} must be [batch, heads, seq, head_dim], got {tuple(t.shape)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"fastbert.ops.{op}: dropout_p must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if bias is not None:
        scores = scores + bias.float()
    # a query with no key to attend to: zero probabilities, and zero gradients through them (a softmax
    # over nothing but -inf would give NaN in both directions)
    dead = torch.isneginf(scores).all(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0).to(q.dtype)
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return torch.matmul(probs, v), probs
