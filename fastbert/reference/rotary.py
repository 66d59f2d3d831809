"""Rotary position embedding (RoPE), the reference layer: what the attention kernels apply to q
and k as they load them when given a rotary table.

transformers' default rope (ModernBERT, and the rotate-half convention of its `apply_rotary_pos_emb`):
with h = head_dim / 2 and inv_freq[i] = 1 / base ** (2i / head_dim) (i < h), the token at position
p has angles p * inv_freq, and

    out[..., i]     = x[..., i] * cos - x[..., i + h] * sin
    out[..., i + h] = x[..., i + h] * cos + x[..., i] * sin        (cos, sin of angle i)

Positions: in the padded layout [batch, heads, seq, head_dim] the row index (0 .. seq - 1, as
transformers counts them); packed [total_tokens, heads, head_dim], the index within the sequence.
The inverse rotation (the gradient's) is the same with -sin.
"""
from __future__ import annotations

from typing import Tuple

import torch


def rotary_tables(base: float, head_dim: int, positions: int, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin): fp32 [positions, head_dim // 2], the angles of positions 0 .. positions - 1,
    computed as transformers computes them (inv_freq from an int64 arange, fp32 products)."""
    if head_dim % 2:
        raise ValueError(f"fastbert: rotary embeddings need an even head_dim, got {head_dim}")
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    angles = torch.arange(positions, dtype=torch.int64, device=device).float()[:, None] * inv_freq[None, :]
    return angles.cos().contiguous(), angles.sin().contiguous()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [..., n, head_dim] rotated at positions 0 .. n - 1 of the tables (cos, sin [>= n, head_dim // 2]);
    computed in fp32 (fp64 for fp64 x), returned in x's dtype. inverse: rotate back (the transpose)."""
    n, h = x.shape[-2], x.shape[-1] // 2
    wide = torch.promote_types(x.dtype, torch.float32)
    c, s = cos[:n].to(wide), (sin[:n] if not inverse else -sin[:n]).to(wide)
    xf = x.to(wide)
    x1, x2 = xf[..., :h], xf[..., h:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def rotate_packed(x: torch.Tensor, cu_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [total_tokens, heads, head_dim] rotated at each token's position within its sequence."""
    out = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        out[lo:hi] = rotate(x[lo:hi].transpose(0, 1), cos, sin).transpose(0, 1)
    return out
