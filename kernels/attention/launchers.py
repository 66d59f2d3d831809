"""The attention launchers: `attention_forward` / `attention_backward` over a padded batch and
`varlen_attention_forward` / `varlen_attention_backward` over packed sequences, plain Python that
puts the arguments in the kernels' form and launches them (the design: the package's docstring).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .. import Settings, cdiv, dropout_options, empty_together, sink
from .args import LOG2E, DistanceOptions, distance_options, optional_tensor, rope_args, rope_tables
from .backward import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel, attention_bwd_preprocess_kernel
from .common import mask_range_kernel
from .forward import attention_fwd_kernel
from .settings import RANGE_SETTINGS, block_d, dot_precision, settings

__all__ = ["attention_forward", "attention_backward", "varlen_attention_forward", "varlen_attention_backward"]


# --------------------------------------------------------------------------------------------
# Launchers


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself when its data pointer is 16-byte aligned and every stride but the last (of a dim
    longer than 1) is a multiple of 16 elements, the specialization all the kernels are built for
    (vectorised rows); else a contiguous copy (every supported head dim is a multiple of 16)."""
    st = t.stride()
    if st[-1] == 1 and t.data_ptr() % 16 == 0 and math.gcd(*st[:-1]) % 16 == 0:  # the usual case, checked quickly
        return t
    ok = t.data_ptr() % 16 == 0 and st[-1] == 1
    ok = ok and all(s % 16 == 0 for n, s in zip(t.shape[:-1], st[:-1]) if n > 1)
    return t if ok else t.contiguous() if not t.is_contiguous() else t.clone()


def _strides(t: torch.Tensor) -> Tuple[int, ...]:
    # strides of all dims but the last; a dim of length 1 is never stepped along: 0
    shape, st = t.shape[:-1], t.stride()[:-1]
    return tuple(0 if n == 1 else s for n, s in zip(shape, st)) if 1 in shape else st


def _padded_strides(t: torch.Tensor) -> Tuple[int, int, int]:
    """(batch, head, row) strides of a [B, H, S, D] tensor."""
    return _strides(t)


def _varlen_strides(t: torch.Tensor) -> Tuple[int, int, int]:
    """(batch, head, row) strides of a [T, H, D] tensor: sequence offsets are token indices."""
    st_t, st_h = _strides(t)
    return st_t, st_h, st_t


def _key_mask(key_mask: Optional[torch.Tensor], batch: int, seq: int, device, even: bool):
    """(mask, ranges) for the padded layout: the bool [B, S] key mask and int32 [B, 2] first and
    one past the last real position of each row (computed on the device). Without a key mask, a
    batch whose S is a multiple of the tiles runs the EVEN variant (None, None); any other S runs
    the masked variant with every token real, so S never needs a variant of its own."""
    if key_mask is None:
        if even:
            return None, None
        mask = torch.ones((batch, seq), dtype=torch.bool, device=device)
    else:
        mask = key_mask if key_mask.dtype == torch.bool else key_mask != 0
        mask = mask if mask.stride(-1) == 1 else mask.contiguous()
    ranges = torch.empty((batch, 2), dtype=torch.int32, device=device)
    s = RANGE_SETTINGS
    mask_range_kernel[(batch,)](ranges, mask, mask.stride(0), seq, BLOCK=s.block_n, **s.options())
    return mask, ranges


_MAX_GRID_YZ = 65535  # CUDA's limit on grid axes 1 and 2 (heads, sequences)


def _check_grid(batch: int, heads: int) -> None:
    if batch > _MAX_GRID_YZ or heads > _MAX_GRID_YZ:
        raise ValueError(f"fastbert: the Triton attention kernels take at most {_MAX_GRID_YZ} sequences and "
                         f"{_MAX_GRID_YZ} heads per call, got {batch} and {heads}; split the batch")


def _is_even(seq: int, *tiles: Settings) -> bool:
    return all(seq % s.block_m == 0 and seq % s.block_n == 0 for s in tiles)


def _lse(shape: Tuple[int, ...], keep: bool, device) -> torch.Tensor:
    """The forward's log-sum-exp, fp32 contiguous `shape`: fresh for the backward, or (keep False,
    inference) the sink nobody reads, whole (the kernel takes its pointer and the strides)."""
    if keep:
        return torch.empty(shape, dtype=torch.float32, device=device)
    return sink(math.prod(shape), device)


def _forward(q, k, v, out, lse, lse_strides, keep, mask, ranges, cu_seqlens, batch, seq, strides, scale, drop, rope,
             dist: DistanceOptions):
    """Launch the forward kernel. strides: (batch, head, row) strides of q, k, v, out (varlen:
    (token, head, token)); seq: S, or max_seqlen with cu_seqlens; rope: None or (cos, sin) (rope_tables);
    dist: the window and relative bias (distance_options)."""
    heads = q.shape[-2] if cu_seqlens is not None else q.shape[1]
    head_dim = q.shape[-1]
    _check_grid(batch, heads)
    s = settings(head_dim, q.dtype, "fwd", rope is not None, dist.local or dist.relative)
    device = q.device
    q_st, k_st, v_st, o_st = strides
    attention_fwd_kernel[(cdiv(seq, s.block_m), heads, batch)](
        out, *o_st,
        lse, *lse_strides,
        optional_tensor(keep, torch.bool, device),
        q, *q_st, k, *k_st, v, *v_st,
        optional_tensor(mask, torch.bool, device), mask.stride(0) if mask is not None else 0,
        optional_tensor(ranges, torch.int32, device),
        optional_tensor(cu_seqlens, torch.int32, device),
        *rope_args(rope, device),
        *dist.args(device),
        heads, seq, head_dim,
        scale * LOG2E,
        drop.seed, drop.threshold, drop.scale,
        BLOCK_M=s.block_m, BLOCK_N=s.block_n, BLOCK_D=block_d(head_dim),
        HAS_MASK=mask is not None, VARLEN=cu_seqlens is not None, HAS_DROPOUT=drop.on,
        RETURN_MASK=keep is not None, ROPE=rope is not None, WINDOW=dist.local, REL_BIAS=dist.relative,
        DOT_PRECISION=dot_precision(q.dtype),
        **s.options(),
    )


def _backward(do, q, k, v, out, lse, lse_strides, mask, ranges, cu_seqlens, batch, seq, strides_of, scale, drop, rope,
              dist: DistanceOptions, grads=None):
    """Launch the three backward kernels; (dq, dk, dv), and drel (fp32 [H, 2n - 1], the relative
    bias's gradient; empty without one). grads: where dq, dk, dv go (q's shape and dtype, last dim
    contiguous, the three with the same strides), or None: fresh and contiguous, from one
    allocation. strides_of: a tensor's (batch, head, row) strides (_padded_strides or
    _varlen_strides); rope, dist: as _forward's."""
    varlen = cu_seqlens is not None
    heads = q.shape[-2] if varlen else q.shape[1]
    head_dim = q.shape[-1]
    _check_grid(batch, heads)
    device = q.device
    dq, dk, dv = grads if grads is not None else empty_together(3, q.shape, q.dtype, device)
    delta = torch.empty_like(lse)
    o_st, do_st, g_st = strides_of(out), strides_of(do), strides_of(dq)

    # delta = rowsum(dO * O) over every row: [B, H, S] as B x H x S rows, varlen [T, H] as 1 x H x T
    s = settings(head_dim, q.dtype, "bwd_preprocess")
    if varlen:
        rows, pre_batch, pre_l, pre_o, pre_do = q.shape[0], 1, (0, lse_strides[1]), (0, *o_st[1:]), (0, *do_st[1:])
    else:
        rows, pre_batch, pre_l, pre_o, pre_do = seq, batch, lse_strides, o_st, do_st
    attention_bwd_preprocess_kernel[(cdiv(rows, s.block_m), heads, pre_batch)](
        delta, *pre_l, out, *pre_o, do, *pre_do, rows, head_dim,
        BLOCK_M=s.block_m, BLOCK_D=block_d(head_dim), **s.options(),
    )

    common = (
        q, *strides_of(q), k, *strides_of(k), v, *strides_of(v), do, *do_st,
        lse, delta, *lse_strides,
        optional_tensor(mask, torch.bool, device), mask.stride(0) if mask is not None else 0,
        optional_tensor(ranges, torch.int32, device),
        optional_tensor(cu_seqlens, torch.int32, device),
        *rope_args(rope, device),
        *dist.args(device),
        heads, seq, head_dim,
        scale * LOG2E, scale,
        drop.seed, drop.threshold, drop.scale,
    )
    flags = dict(BLOCK_D=block_d(head_dim), HAS_MASK=mask is not None, VARLEN=varlen, HAS_DROPOUT=drop.on,
                 ROPE=rope is not None, WINDOW=dist.local, REL_BIAS=dist.relative, DOT_PRECISION=dot_precision(q.dtype))
    variant = (rope is not None, dist.local or dist.relative)
    # dq first: it also replaces delta by the exact rowsum(p * dp) that dk / dv then use
    s = settings(head_dim, q.dtype, "bwd_dq", *variant)
    attention_bwd_dq_kernel[(cdiv(seq, s.block_m), heads, batch)](
        dq, *g_st, *common, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **s.options(),
    )
    s = settings(head_dim, q.dtype, "bwd_dkdv", *variant)
    drel = dist.grad_buffer(device)
    attention_bwd_dkdv_kernel[(cdiv(seq, s.block_n), heads, batch)](
        dk, *g_st, dv, *g_st, drel, *common, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **s.options(),
    )
    return dq, dk, dv, drel


def _grads(dq, dk, dv, drel, rel_bias: Optional[torch.Tensor]):
    # (dq, dk, dv), and the relative bias's gradient in its dtype when there is one
    return (dq, dk, dv) if rel_bias is None else (dq, dk, dv, drel.to(rel_bias.dtype))


def _no_grads(q: torch.Tensor, rel_bias: Optional[torch.Tensor], grads=None):
    # the gradients of an empty problem: zeros (written into grads where given)
    if grads is None:
        grads = tuple(torch.zeros(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    else:
        for g in grads:
            g.zero_()
    return _grads(*grads, None if rel_bias is None else torch.zeros_like(rel_bias), rel_bias)


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: Optional[torch.Tensor],
    scale: float,
    dropout_p: float,
    seed: Optional[int],
    return_dropout_mask: bool,
    rope_cos: Optional[torch.Tensor] = None,
    rope_sin: Optional[torch.Tensor] = None,
    window: int = -1,
    rel_bias: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    keep_lse: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(out, lse, keep) of attention over a padded batch.

    q, k, v: [B, H, S, D] fp32/fp16/bf16, last dim contiguous, D in HEAD_DIMS; key_mask: None or
    [B, S] (nonzero = real token; any pattern, holes included); seed: a Python int in [0, 2**63)
    when dropout_p > 0. out: [B, H, S, D] contiguous, q.dtype, zeros at padded query positions;
    lse: fp32 [B, H, S] (for attention_backward); keep: bool [B, H, S, S], the dropout keep-mask
    the kernel drew, when return_dropout_mask and dropout_p > 0, else None. rope_cos, rope_sin:
    None, or the rotary tables (fp32 [P >= S, D / 2], fastbert.reference.rotary_tables) by which
    q and k are rotated at positions 0 .. S - 1 (padding included) before the scores. window:
    local attention, query i sees the keys j with |i - j| <= window (< 0: every key); rel_bias:
    None, or float [H, 2n - 1] (n >= S) whose entry j - i + n - 1 is added to the scaled score of
    query i and key j (positions: rows, padding included).
    For inference: out, where the output goes ([B, H, S, D] in q.dtype, last dim contiguous; q
    itself allowed: a program reads its queries before its loop over the keys and writes the same
    rows after it); keep_lse False: lse is not kept (None).
    """
    batch, heads, seq, head_dim = q.shape
    drop = dropout_options(dropout_p, seed, "attention")
    rope = rope_tables(rope_cos, rope_sin, head_dim, seq, q.device)
    dist = distance_options(window, rel_bias, heads, seq, q.device)
    if out is None:
        out = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    lse = _lse((batch, heads, seq), keep_lse, q.device)
    keep = None
    if return_dropout_mask and drop.on:
        keep = torch.empty((batch, heads, seq, seq), dtype=torch.bool, device=q.device)
    if out.numel() == 0:
        return out, lse if keep_lse else None, keep
    q, k, v = (_aligned(t) for t in (q, k, v))
    # the debug mask output is built into the masked and varlen variants only
    even = keep is None and _is_even(seq, settings(head_dim, q.dtype, "fwd", rope is not None,
                                                   dist.local or dist.relative))
    mask, ranges = _key_mask(key_mask, batch, seq, q.device, even)
    strides = tuple(_padded_strides(t) for t in (q, k, v, out))
    _forward(q, k, v, out, lse, (heads * seq, seq), keep, mask, ranges, None, batch, seq, strides, scale, drop, rope,
             dist)
    return out, lse if keep_lse else None, keep


def attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    key_mask: Optional[torch.Tensor],
    scale: float,
    dropout_p: float,
    seed: Optional[int],
    rope_cos: Optional[torch.Tensor] = None,
    rope_sin: Optional[torch.Tensor] = None,
    window: int = -1,
    rel_bias: Optional[torch.Tensor] = None,
    *,
    grads: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of attention_forward, [B, H, S, D] contiguous in q.dtype (zeros at padded
    positions), and with rel_bias its gradient drel (rel_bias's shape and dtype). do: the gradient
    of out; out, lse: from attention_forward; the same key_mask, scale, dropout_p, seed (the dropout
    mask is regenerated, not stored), rotary tables (dq, dk: the gradients of the unrotated q, k),
    window and rel_bias. grads: where dq, dk, dv go ([B, H, S, D] in q.dtype, last dim contiguous,
    the three with the same strides: the slices of one QKV gradient), or None: fresh."""
    batch, heads, seq, head_dim = q.shape
    drop = dropout_options(dropout_p, seed, "attention")
    rope = rope_tables(rope_cos, rope_sin, head_dim, seq, q.device)
    dist = distance_options(window, rel_bias, heads, seq, q.device)
    if q.numel() == 0:
        return _no_grads(q, rel_bias, grads)
    q, k, v, out, do = (_aligned(t) for t in (q, k, v, out, do))
    variant = (rope is not None, dist.local or dist.relative)
    even = _is_even(seq, *(settings(head_dim, q.dtype, kernel, *variant) for kernel in ("bwd_dkdv", "bwd_dq")))
    mask, ranges = _key_mask(key_mask, batch, seq, q.device, even)
    return _grads(*_backward(do, q, k, v, out, lse, lse.stride()[:2], mask, ranges, None, batch, seq, _padded_strides,
                             scale, drop, rope, dist, grads), rel_bias)


def varlen_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
    dropout_p: float,
    seed: Optional[int],
    return_dropout_mask: bool,
    rope_cos: Optional[torch.Tensor] = None,
    rope_sin: Optional[torch.Tensor] = None,
    window: int = -1,
    rel_bias: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    keep_lse: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(out, lse, keep) of attention over packed sequences.

    q, k, v: [T, H, D], sequence b = tokens cu_seqlens[b]:cu_seqlens[b + 1] (int32 [B + 1], on
    q's device, cu_seqlens[B] = T); max_seqlen >= every length. out: [T, H, D] contiguous; lse:
    fp32 [H, T]; keep: bool [B, H, max_seqlen, max_seqlen] (sequence b in its top-left corner;
    the whole block follows the dropout rule) when return_dropout_mask and dropout_p > 0, else None.
    rope_cos, rope_sin: None, or rotary tables (fp32 [P >= max_seqlen, D / 2]) by which q and k are
    rotated at each token's position within its sequence. window, rel_bias: as attention_forward's
    (n >= max_seqlen), positions counted within each sequence. out, keep_lse: as attention_forward's
    ([T, H, D]).
    """
    total, heads, head_dim = q.shape
    batch = cu_seqlens.shape[0] - 1
    drop = dropout_options(dropout_p, seed, "attention")
    rope = rope_tables(rope_cos, rope_sin, head_dim, max_seqlen, q.device)
    dist = distance_options(window, rel_bias, heads, max_seqlen, q.device)
    if out is None:
        out = torch.empty((total, heads, head_dim), dtype=q.dtype, device=q.device)
    lse = _lse((heads, total), keep_lse, q.device)
    keep = None
    if return_dropout_mask and drop.on:
        keep = torch.empty((batch, heads, max_seqlen, max_seqlen), dtype=torch.bool, device=q.device)
    if batch <= 0 or heads == 0 or max_seqlen <= 0:
        return out, lse if keep_lse else None, keep
    q, k, v = (_aligned(t) for t in (q, k, v))
    strides = tuple(_varlen_strides(t) for t in (q, k, v, out))
    _forward(q, k, v, out, lse, (1, total), keep, None, None, cu_seqlens, batch, max_seqlen, strides,
             scale, drop, rope, dist)
    return out, lse if keep_lse else None, keep


def varlen_attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
    dropout_p: float,
    seed: Optional[int],
    rope_cos: Optional[torch.Tensor] = None,
    rope_sin: Optional[torch.Tensor] = None,
    window: int = -1,
    rel_bias: Optional[torch.Tensor] = None,
    *,
    grads: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of varlen_attention_forward: [T, H, D] contiguous in q.dtype, and with
    rel_bias its gradient drel; the same cu_seqlens, max_seqlen, scale, dropout_p, seed, rotary
    tables, window and rel_bias as the forward. grads: as attention_backward's ([T, H, D])."""
    batch = cu_seqlens.shape[0] - 1
    drop = dropout_options(dropout_p, seed, "attention")
    rope = rope_tables(rope_cos, rope_sin, q.shape[-1], max_seqlen, q.device)
    dist = distance_options(window, rel_bias, q.shape[1], max_seqlen, q.device)
    if batch <= 0 or max_seqlen <= 0 or q.numel() == 0:
        return _no_grads(q, rel_bias, grads)
    q, k, v, out, do = (_aligned(t) for t in (q, k, v, out, do))
    return _grads(*_backward(do, q, k, v, out, lse, (1, lse.stride(0)), None, None, cu_seqlens, batch, max_seqlen,
                             _varlen_strides, scale, drop, rope, dist, grads), rel_bias)
