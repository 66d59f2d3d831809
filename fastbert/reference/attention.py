"""Attention with a padding mask, padded and packed, spelled out (softmax(q k^T * scale) v); its
dropout counters are described in fastbert.reference.philox."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from fastbert.layouts import relative_bias_matrix
from fastbert.reference.philox import dropout_threshold, philox_uint32

MAX_DROPOUT_SEQLEN = 1 << 16  # attention dropout counters hold a query and a key position in 16 bits each


def attention_dropout_offsets(
    batch: int, heads: int, seq_q: int, seq_k: int, starts: Optional[torch.Tensor] = None, device=None
) -> torch.Tensor:
    """int64 [batch, heads, seq_q, seq_k]: the attention dropout counter of each probability (see the
    module docstring). starts: int [batch], each sequence's first real position (zeros when None)."""
    if max(seq_q, seq_k) > MAX_DROPOUT_SEQLEN:
        raise ValueError(
            f"attention dropout takes sequences of at most {MAX_DROPOUT_SEQLEN} tokens, got {max(seq_q, seq_k)}"
        )
    b = torch.arange(batch, dtype=torch.int64, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, dtype=torch.int64, device=device).view(1, -1, 1, 1)
    i = torch.arange(seq_q, dtype=torch.int64, device=device).view(1, 1, -1, 1)
    j = torch.arange(seq_k, dtype=torch.int64, device=device).view(1, 1, 1, -1)
    if starts is not None:
        st = starts.to(device=device, dtype=torch.int64).view(-1, 1, 1, 1)
        i, j = (i - st) & 0xFFFF, (j - st) & 0xFFFF  # positions before the start are padding anyway
    return ((b * heads + h) << 32) + (i << 16) + j


def attention_keep_mask(
    seed, batch: int, heads: int, seq_q: int, seq_k: int, p: float, starts: Optional[torch.Tensor] = None, device=None
) -> torch.Tensor:
    """bool [batch, heads, seq_q, seq_k]: the probabilities attention dropout keeps, for `seed`."""
    u = philox_uint32(seed, attention_dropout_offsets(batch, heads, seq_q, seq_k, starts, device))
    return (u >> 8) >= dropout_threshold(p)


def mask_starts(attention_mask: torch.Tensor) -> torch.Tensor:
    """int64 [batch]: the first real position of each row of a [batch, seq] mask (0 for a row with none)."""
    m = attention_mask.to(torch.bool)
    return torch.where(m.any(-1), m.to(torch.int8).argmax(-1), 0).to(torch.int64)


def window_band(seq: int, window: int, device=None) -> torch.Tensor:
    """bool [seq, seq]: key j is within query i's window, |i - j| <= window (local attention)."""
    pos = torch.arange(seq, device=device)
    return (pos[:, None] - pos[None, :]).abs() <= window


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, scale: Optional[float] = None,
              keep_mask: Optional[torch.Tensor] = None, window: Optional[int] = None,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, spelled out; q, k, v: [batch, heads, seq, head_dim].

    attention_mask: [batch, seq], 1/True = real token. Padded keys get no weight; padded queries
    return zeros (and pass no gradient), and so does a query with no real key. keep_mask
    ([batch, heads, seq, seq] bool) applies dropout to the probabilities when dropout_p > 0 (drawn
    with torch's RNG when not given; attention_keep_mask gives fastbert's counter-based mask).
    window: local attention, a query sees the keys at most `window` positions away (row indices).
    bias: added to the scaled scores, broadcast to [batch, heads, seq, seq] (MPNet's relative
    position bias: relative_bias_matrix).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if window is not None:
        scores = scores.masked_fill(~window_band(q.shape[-2], window, q.device), float("-inf"))
    if attention_mask is not None:
        keys = attention_mask.to(torch.bool)[:, None, None, :]
        scores = scores.masked_fill(~keys, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows with no real key: all -inf -> zeros
    probs = probs.to(q.dtype)
    if dropout_p > 0.0:
        if keep_mask is None:
            keep_mask = torch.rand_like(probs, dtype=torch.float32) >= dropout_p
        probs = probs * keep_mask.to(probs.dtype) / (1.0 - dropout_p)
    out = torch.matmul(probs, v)
    if attention_mask is not None:
        out = out * attention_mask.to(out.dtype)[:, None, :, None]
    return out


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    keep_mask: Optional[torch.Tensor] = None,
    window: Optional[int] = None,
    relative: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """attention over packed sequences, one at a time; q, k, v: [total_tokens, heads, head_dim],
    cu_seqlens: [batch + 1], sequence b is tokens cu_seqlens[b]:cu_seqlens[b + 1].
    keep_mask: bool [batch, heads, >= max_seqlen, >= max_seqlen] (sequence b uses its top-left corner).
    relative: [heads, 2n - 1] relative position bias (relative_bias), positions counted in each sequence."""
    out = torch.zeros_like(q)
    bounds = cu_seqlens.tolist()
    for b in range(len(bounds) - 1):
        lo, hi = bounds[b], bounds[b + 1]
        if hi == lo:
            continue
        qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        keep = None if keep_mask is None else keep_mask[b : b + 1, :, : hi - lo, : hi - lo]
        bias = None if relative is None else relative_bias_matrix(relative, hi - lo)
        o = attention(qs, ks, vs, None, dropout_p, scale, keep, window, bias)
        out[lo:hi] = o.squeeze(0).transpose(0, 1)
    return out


class Attention(nn.Module):
    def __init__(self, dropout_p: float = 0.0, scale: Optional[float] = None):
        super().__init__()
        self.dropout_p = dropout_p
        self.scale = scale

    def forward(self, q, k, v, attention_mask=None):
        p = self.dropout_p if self.training else 0.0
        return attention(q, k, v, attention_mask, p, self.scale)
