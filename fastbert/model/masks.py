"""The attention masks and head masks transformers' BERT accepts, in the forms fastbert runs:

    attention_mask [batch, seq] (bool, integer or 0/1 float; 1 = real token): a padding mask, run
        by the fused attention (packed when the batch has padding);
    [batch, seq_q, seq_k] (1 = may attend) or [batch, 1 or heads, seq_q or 1, seq_k] (bool, 0/1
        integer, or an additive float mask: 0 = attend, large negative = masked): reduced to a
        padding mask when it is one (the same for every query and head, nothing but 0 / masked),
        otherwise kept as an additive bias for the explicit attention path;
    head_mask [heads] or [layers, heads] (or transformers' [layers, 1, heads, 1, 1]): a factor per
        layer and head on the attention probabilities, which is a factor on that head's output.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from fastbert.ops.checks import check_binary_mask, check_shape_like, check_tensor

WHERE = "fastbert"


def attention_masks(mask, batch: int, seq: int, heads: int) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(key mask bool [batch, seq] or None, additive bias float32 [batch, 1 or heads, seq or 1, seq] or None)."""
    if mask is None:
        return None, None
    check_tensor(WHERE, "attention_mask", mask)
    compiling = torch.compiler.is_compiling()  # no value checks or value-dependent choices while tracing
    if mask.dim() == 2:
        check_shape_like(WHERE, "attention_mask", mask, (batch, seq))
        return (mask != 0 if compiling else check_binary_mask(WHERE, "attention_mask", mask)), None
    if mask.dim() == 3:
        mask = mask[:, None]
    if mask.dim() != 4 or mask.shape[0] != batch or mask.shape[-1] != seq or mask.shape[1] not in (1, heads) \
            or mask.shape[2] not in (1, seq):
        raise ValueError(
            f"{WHERE}: attention_mask has shape {tuple(mask.shape)}; it must be [batch, seq] = ({batch}, {seq}), "
            f"[batch, seq, seq] or [batch, 1 or heads, seq or 1, seq]"
        )
    if compiling:
        bias = mask.float() if mask.is_floating_point() else torch.zeros(mask.shape, device=mask.device).masked_fill(
            mask == 0, float("-inf"))
        return None, bias
    if mask.is_floating_point():
        bias = mask.float().clamp(min=torch.finfo(torch.float32).min)
        masked = bias <= torch.finfo(torch.float32).min / 2
        if not ((bias == 0) | masked).all():
            return None, bias  # a soft bias: only the explicit path can add it
        allowed = ~masked
    else:
        allowed = check_binary_mask(WHERE, "attention_mask", mask)
    if (allowed == allowed[:, :1, :1, :]).all():  # the same keys for every head and query: padding
        return allowed[:, 0, 0, :], None
    return None, torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill(~allowed, float("-inf"))


def head_scales(head_mask, layers: int, heads: int) -> List[Optional[torch.Tensor]]:
    """One factor [heads] per layer (None: no head mask)."""
    if head_mask is None:
        return [None] * layers
    check_tensor(WHERE, "head_mask", head_mask)
    hm = head_mask
    if hm.dim() == 5:  # transformers' extended form [layers, 1, heads, 1, 1]
        hm = hm.reshape(hm.shape[0], hm.shape[2])
    if hm.dim() == 1:
        hm = hm.expand(layers, -1)
    if hm.dim() != 2 or tuple(hm.shape) != (layers, heads):
        raise ValueError(
            f"{WHERE}: head_mask has shape {tuple(head_mask.shape)}; it must be [heads] = ({heads},) or "
            f"[layers, heads] = ({layers}, {heads})"
        )
    return list(hm.unbind(0))
