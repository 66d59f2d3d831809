"""Unpad once, pad once: move a padded batch to packed tokens and back.

    unpad(hidden, attention_mask) -> (packed, indices, cu_seqlens, max_seqlen)
        hidden:         [batch, seq, ...]   any dtype
        attention_mask: [batch, seq]        bool or integer (1/True = real token, HF convention)
        packed:         [total_tokens, ...] the real tokens, sequence after sequence, in order
        indices:        int64 [total_tokens], flat position b * seq + s of each packed token
        cu_seqlens:     int32 [batch + 1], sequence b is packed[cu_seqlens[b]:cu_seqlens[b + 1]]
        max_seqlen:     int, the longest sequence (0 for an all-padding batch)
    pad(packed, indices, batch, seqlen) -> hidden
        packed [total_tokens, ...] -> hidden [batch, seqlen, ...], zeros at padded positions

Both are a gather and a scatter with autograd Functions of their own (the gradient of one is the
other), so the unpadded model path pays for exactly the real tokens. On the CPU the index
building runs in the C++ extension (one pass over the mask); elsewhere in torch ops.
"""
from __future__ import annotations

from itertools import chain
from typing import List, Tuple

import numpy as np
import torch

from fastbert import backend as fb_backend
from fastbert.ops.checks import check_device, check_mask, check_tensor


def _check_mask(op: str, attention_mask) -> torch.Tensor:
    """The [batch, seq] mask as bool (bool or integer masks nonzero = real; floating ones must be 0/1)."""
    check_tensor(op, "attention_mask", attention_mask)
    if attention_mask.dim() != 2:
        raise ValueError(
            f"fastbert.ops.{op}: attention_mask must be [batch, seq], got shape {tuple(attention_mask.shape)}"
        )
    return check_mask(op, "attention_mask", attention_mask)


def unpad_indices(attention_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """(indices int64 [total_tokens], cu_seqlens int32 [batch + 1], max_seqlen) of a [batch, seq] mask."""
    m = _check_mask("unpad", attention_mask)
    build = fb_backend.cpp_function("unpad_indices") if m.device.type == "cpu" else None
    if build is not None:
        indices, cu_seqlens, max_seqlen = build(m.contiguous())
        return indices, cu_seqlens, int(max_seqlen)
    seqlens = m.sum(dim=1, dtype=torch.int32)
    indices = torch.nonzero(m.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    return indices, cu_seqlens, max_seqlen


class _Gather(torch.autograd.Function):
    """rows [n, ...] -> rows[indices] [len(indices), ...]; backward scatters into zeros."""

    @staticmethod
    def forward(ctx, rows, indices):
        ctx.save_for_backward(indices)
        ctx.n = rows.shape[0]
        return rows.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        out = grad.new_zeros((ctx.n,) + tuple(grad.shape[1:]))
        out.index_copy_(0, indices, grad)  # indices are distinct: no sums, no atomics
        return out, None


class _Scatter(torch.autograd.Function):
    """packed [t, ...] -> zeros [n, ...] with row indices[i] = packed[i]; backward gathers."""

    @staticmethod
    def forward(ctx, packed, indices, n):
        ctx.save_for_backward(indices)
        out = packed.new_zeros((n,) + tuple(packed.shape[1:]))
        out.index_copy_(0, indices, packed)
        return out

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        return grad.index_select(0, indices), None, None


def unpad(hidden: torch.Tensor, attention_mask: torch.Tensor):
    """The real tokens of a padded batch, packed: see the module docstring for every shape."""
    check_tensor("unpad", "hidden", hidden)
    _check_mask("unpad", attention_mask)
    if hidden.dim() < 2 or tuple(hidden.shape[:2]) != tuple(attention_mask.shape):
        raise ValueError(
            f"fastbert.ops.unpad: hidden has shape {tuple(hidden.shape)} but attention_mask has shape "
            f"{tuple(attention_mask.shape)}; hidden must be [batch, seq, ...] with [batch, seq] = the mask's shape"
        )
    check_device("unpad", "attention_mask", attention_mask, hidden, like="hidden")
    indices, cu_seqlens, max_seqlen = unpad_indices(attention_mask)
    rows = hidden.reshape((hidden.shape[0] * hidden.shape[1],) + tuple(hidden.shape[2:]))
    return _Gather.apply(rows, indices), indices, cu_seqlens, max_seqlen


def pad(packed: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """packed [total_tokens, ...] back to [batch, seqlen, ...], zeros at the padded positions."""
    check_tensor("pad", "packed", packed)
    check_tensor("pad", "indices", indices)
    if indices.dim() != 1 or indices.dtype != torch.int64:
        raise ValueError(f"fastbert.ops.pad: indices must be int64 [total_tokens], got {indices.dtype} {tuple(indices.shape)}")
    if packed.dim() < 1 or packed.shape[0] != indices.shape[0]:
        raise ValueError(
            f"fastbert.ops.pad: packed has {packed.shape[0] if packed.dim() else 0} rows but indices has "
            f"{indices.shape[0]}; they must match"
        )
    if batch < 0 or seqlen < 0:
        raise ValueError(f"fastbert.ops.pad: batch and seqlen must be >= 0, got {batch}, {seqlen}")
    out = _Scatter.apply(packed, indices, batch * seqlen)
    return out.view((batch, seqlen) + tuple(packed.shape[1:]))


def heads_padded(tensors, cu_seqlens: torch.Tensor, max_seqlen: int):
    """Packed rows [total_tokens, heads, d] (each of `tensors`) as [batch, heads, max_seqlen, d], with
    the bool [batch, max_seqlen] mask of the real positions and the tokens' flat indices, which
    heads_packed takes back: how an op's padded formulation serves its packed entry point."""
    batch = cu_seqlens.shape[0] - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    mask = torch.arange(max_seqlen, device=cu_seqlens.device)[None, :] < lengths[:, None]
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    return [pad(t, indices, batch, max_seqlen).transpose(1, 2) for t in tensors], mask, indices


def heads_packed(padded: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """[batch, heads, seq, d] back to the packed rows [total_tokens, heads, d] at `indices` (heads_padded's)."""
    batch, heads, seq, d = padded.shape
    return padded.transpose(1, 2).reshape(batch * seq, heads, d).index_select(0, indices)


def pad_id_lists(rows: List, lengths: List[int], seq: int, real: torch.Tensor, value: int, name: str) -> torch.Tensor:
    """int64 [batch, seq]: rows of ids (lists of ints or 1-D integer tensors) left-aligned, `value`
    after them; `real` is the bool [batch, seq] mask of the positions the rows fill. A value that is
    not an integer is a TypeError naming `name`."""
    if all(isinstance(r, torch.Tensor) for r in rows):
        for r in rows:
            if r.dim() != 1 or r.is_floating_point() or r.is_complex() or r.dtype == torch.bool:
                raise TypeError(f"{name} tensors must be 1-D integer tensors, got {r.dtype} {tuple(r.shape)}")
        out = torch.full((len(rows), seq), value, dtype=torch.int64)
        out.masked_scatter_(real, torch.cat([r.to(torch.int64) for r in rows]))
        return out
    rows = [r.tolist() if isinstance(r, torch.Tensor) else r for r in rows]
    build = fb_backend.cpp_function("pad_id_lists")
    if build is not None and all(isinstance(r, (list, tuple)) for r in rows):
        try:
            return build(rows, seq, value)
        except TypeError as exc:
            raise TypeError(f"{name} must hold integer ids ({exc})") from None
    # without the extension: through float64 (exact for ids below 2**53), so that a value that is not
    # an integer is caught rather than truncated
    try:
        values = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=sum(lengths))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be lists of ints or 1-D integer tensors ({exc})") from None
    if not (np.isfinite(values).all() and np.array_equal(values, np.floor(values))):
        raise TypeError(f"{name} holds values that are not integers")
    out = torch.full((len(rows), seq), value, dtype=torch.int64)
    out.masked_scatter_(real, torch.from_numpy(values.astype(np.int64)))
    return out
