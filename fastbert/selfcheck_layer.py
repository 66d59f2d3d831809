"""`fastbert selfcheck`'s check of fastbert.ops.encoder_layer: one post-LN encoder layer (padded
with a mixed padding mask, and packed) against the same layer written out in plain torch in fp64,
at the real tokens, with the bound of every other op (fastbert.selfcheck.bound_check)."""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

import fastbert

Row = tuple


def _weights(hidden: int, ffn: int, g: torch.Generator):
    def t(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    return fastbert.ops.LayerWeights(
        t(3 * hidden, hidden, scale=hidden ** -0.5), t(3 * hidden), t(hidden, hidden, scale=hidden ** -0.5), t(hidden),
        1 + 0.1 * t(hidden), t(hidden), t(ffn, hidden, scale=hidden ** -0.5), t(ffn), t(hidden, ffn, scale=ffn ** -0.5),
        t(hidden), 1 + 0.1 * t(hidden), t(hidden))


def _written_out(x, w, mask, heads: int, eps: float):
    """The layer in plain torch (any dtype): softmax attention over the real keys, add + LayerNorm,
    erf GELU feed-forward, add + LayerNorm."""
    batch, seq, hidden = x.shape
    d = hidden // heads
    q, k, v = F.linear(x, w.qkv_weight, w.qkv_bias).view(batch, seq, 3, heads, d).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-1, -2)) / d ** 0.5
    scores = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
    ctx = torch.nan_to_num(scores.softmax(-1)) @ v
    ctx = ctx.transpose(1, 2).reshape(batch, seq, hidden)
    h1 = F.layer_norm(F.linear(ctx, w.out_weight, w.out_bias) + x, (hidden,), w.norm1_weight, w.norm1_bias, eps)
    inter = F.gelu(F.linear(h1, w.ffn_in_weight, w.ffn_in_bias))
    return F.layer_norm(F.linear(inter, w.ffn_out_weight, w.ffn_out_bias) + h1, (hidden,), w.norm2_weight,
                        w.norm2_bias, eps)


def encoder_layer_rows(shape, dtype, backend: str, device: str, mask: torch.Tensor, g: torch.Generator,
                       bound_check) -> List[Row]:
    """shape: [batch, seq, hidden, heads]; mask [batch, seq] (some rows empty or left-padded)."""
    batch, seq, hidden, heads = shape
    w64 = fastbert.ops.LayerWeights(*(t.double() for t in _weights(hidden, 2 * hidden, g)))
    x64 = torch.randn(batch, seq, hidden, generator=g, dtype=torch.float64)
    w = fastbert.ops.LayerWeights(*(t.to(device, dtype) for t in w64))
    x, mask = x64.to(device, dtype), mask.to(device)
    real = mask.bool()
    ref64 = _written_out(x64.to(device), fastbert.ops.LayerWeights(*(t.to(device) for t in w64)), mask, heads, 1e-12)
    rows = []
    with torch.no_grad():
        base = _written_out(x, w, mask, heads, 1e-12)
        out = fastbert.ops.encoder_layer(x, w, heads=heads, eps=(1e-12, 1e-12), attention_mask=mask, backend=backend)
        rows.append(("y (padded)", *bound_check(out[real], base[real], ref64[real], dtype)))
        lengths = real.sum(1)
        cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
        packed = fastbert.ops.encoder_layer(x[real], w, heads=heads, eps=(1e-12, 1e-12), cu_seqlens=cu,
                                            max_seqlen=int(lengths.max()), backend=backend)
        # the layer has no positions of its own: a sequence's real tokens packed give what they gave padded
        rows.append(("y (packed)", *bound_check(packed, base[real], ref64[real], dtype)))
    return rows
