"""The attention launchers: `attention_forward` / `attention_backward` over a padded batch and
`varlen_attention_forward` / `varlen_attention_backward` over packed sequences, plain Python that
puts the arguments in the kernels' form and launches them (the design: the package's docstring);
`qkv_attention_forward` / `qkv_attention_backward`, the same launches on a layer's joined QKV rows,
their arguments bound once per specialization (what the layer routes call at every layer).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .. import Bound, Settings, cdiv, dropout_options, empty_together, fresh_or_given, launch, sink
from .args import LOG2E, DistanceOptions, distance_options, optional_tensor, rope_args, rope_tables
from .backward import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel, attention_bwd_preprocess_kernel
from .common import mask_range_kernel
from .forward import attention_fwd_kernel
from .settings import RANGE_SETTINGS, block_d, dot_precision, settings

__all__ = ["attention_forward", "attention_backward", "varlen_attention_forward", "varlen_attention_backward",
           "qkv_attention_forward", "qkv_attention_backward", "key_mask_ranges", "delta_launch"]


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


def key_mask_ranges(key_mask: Optional[torch.Tensor], batch: int, seq: int, device, even: bool):
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
    launch(mask_range_kernel, (batch,), (ranges, mask, mask.stride(0), seq), dict(BLOCK=s.block_n, **s.options()))
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
    kernel, grid, args, options = _forward_launch(q, k, v, out, lse, lse_strides, keep, mask, ranges, cu_seqlens, batch,
                                                  seq, strides, scale, drop, rope, dist)
    launch(kernel, grid, args, options)


def _forward_launch(q, k, v, out, lse, lse_strides, keep, mask, ranges, cu_seqlens, batch, seq, strides, scale, drop,
                    rope, dist: DistanceOptions):
    """(kernel, grid, positional arguments, keyword arguments) of _forward's launch."""
    heads = q.shape[-2] if cu_seqlens is not None else q.shape[1]
    head_dim = q.shape[-1]
    _check_grid(batch, heads)
    s = settings(head_dim, q.dtype, "fwd", rope is not None, dist.local or dist.relative)
    device = q.device
    q_st, k_st, v_st, o_st = strides
    args = (
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
    )
    options = dict(
        BLOCK_M=s.block_m, BLOCK_N=s.block_n, BLOCK_D=block_d(head_dim),
        HAS_MASK=mask is not None, VARLEN=cu_seqlens is not None, HAS_DROPOUT=drop.on,
        RETURN_MASK=keep is not None, ROPE=rope is not None, WINDOW=dist.local, REL_BIAS=dist.relative,
        DOT_PRECISION=dot_precision(q.dtype),
        **s.options(),
    )
    return attention_fwd_kernel, (cdiv(seq, s.block_m), heads, batch), args, options


def _backward(do, q, k, v, out, lse, lse_strides, mask, ranges, cu_seqlens, batch, seq, strides_of, scale, drop, rope,
              dist: DistanceOptions, grads=None):
    """Launch the three backward kernels; (dq, dk, dv), and drel (fp32 [H, 2n - 1], the relative
    bias's gradient; empty without one). grads: where dq, dk, dv go (q's shape and dtype, last dim
    contiguous, the three with the same strides), or None: fresh and contiguous, from one
    allocation. strides_of: a tensor's (batch, head, row) strides (_padded_strides or
    _varlen_strides); rope, dist: as _forward's."""
    dq, dk, dv = grads if grads is not None else empty_together(3, q.shape, q.dtype, q.device)
    drel = dist.grad_buffer(q.device)
    for kernel, grid, args, options in _backward_launches(do, q, k, v, out, lse, torch.empty_like(lse), lse_strides,
                                                          mask, ranges, cu_seqlens, batch, seq, strides_of, scale,
                                                          drop, rope, dist, (dq, dk, dv), drel):
        launch(kernel, grid, args, options)
    return dq, dk, dv, drel


def _backward_launches(do, q, k, v, out, lse, delta, lse_strides, mask, ranges, cu_seqlens, batch, seq, strides_of,
                       scale, drop, rope, dist: DistanceOptions, grads, drel):
    """The (kernel, grid, positional arguments, keyword arguments) of _backward's three launches, in
    their order; delta: lse's shape, for the preprocessing kernel to fill; grads: (dq, dk, dv); drel:
    dist.grad_buffer's."""
    varlen = cu_seqlens is not None
    heads = q.shape[-2] if varlen else q.shape[1]
    head_dim = q.shape[-1]
    _check_grid(batch, heads)
    device = q.device
    dq, dk, dv = grads
    o_st, do_st, g_st = strides_of(out), strides_of(do), strides_of(dq)

    launches = [delta_launch(out, do, delta, lse_strides, o_st, do_st, varlen, batch, seq, heads)]

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
    launches.append((attention_bwd_dq_kernel, (cdiv(seq, s.block_m), heads, batch), (dq, *g_st, *common),
                     dict(BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **s.options())))
    s = settings(head_dim, q.dtype, "bwd_dkdv", *variant)
    launches.append((attention_bwd_dkdv_kernel, (cdiv(seq, s.block_n), heads, batch),
                     (dk, *g_st, dv, *g_st, drel, *common),
                     dict(BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **s.options())))
    return launches


def delta_launch(out, do, delta, lse_strides, o_strides, do_strides, varlen: bool, batch: int, seq: int, heads: int):
    """(kernel, grid, positional arguments, keyword arguments) of the backward's preprocessing launch,
    delta = rowsum(dO * O) over every row into delta (lse's layout: [B, H, S] as B x H x S rows,
    varlen [H, T] as 1 x H x T); o_strides, do_strides: the (batch or token, head, row) strides."""
    head_dim = out.shape[-1]
    s = settings(head_dim, out.dtype, "bwd_preprocess")
    if varlen:
        rows, pre_batch = out.shape[0], 1
        pre_l, pre_o, pre_do = (0, lse_strides[1]), (0, *o_strides[1:]), (0, *do_strides[1:])
    else:
        rows, pre_batch, pre_l, pre_o, pre_do = seq, batch, lse_strides, o_strides, do_strides
    return (attention_bwd_preprocess_kernel, (cdiv(rows, s.block_m), heads, pre_batch),
            (delta, *pre_l, out, *pre_o, do, *pre_do, rows, head_dim),
            dict(BLOCK_M=s.block_m, BLOCK_D=block_d(head_dim), **s.options()))


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
    mask, ranges = key_mask_ranges(key_mask, batch, seq, q.device, even)
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
    mask, ranges = key_mask_ranges(key_mask, batch, seq, q.device, even)
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


# --------------------------------------------------------------------------------------------
# Attention on a layer's joined QKV rows, its launches bound once per specialization (the layer routes')

_BOUND: dict = {}  # specialization of a call -> its bound launches (None: the launchers run it)
_BOUND_LIMIT = 256  # specializations kept before the table starts again (a process meets few)

# The arguments that change with the sizes (or are the call's own), per layout: every other argument
# of a bound launch is fixed by its specialization. Strides of a dim of length 1 are passed as they
# are (the launchers pass 0): never stepped along, and divisible by 16 either way, so the JIT takes the
# same compiled kernel.
_VARYING = {
    "varlen": {"OUT", "LSE", "DELTA", "DO", "Q", "K", "V", "DQ", "DK", "DV", "CU_SEQLENS", "ROPE_COS", "ROPE_SIN",
               "stride_lh", "seq", "seed", "rows_total"},
    "padded": {"OUT", "LSE", "DELTA", "DO", "Q", "K", "V", "DQ", "DK", "DV", "MASK", "RANGES", "ROPE_COS", "ROPE_SIN",
               "stride_lb", "stride_lh", "stride_ob", "stride_dob", "stride_qb", "stride_kb", "stride_vb", "stride_dqb",
               "stride_dkb", "stride_dvb", "stride_mb", "seq", "seed", "rows_total"},
}


def _specialization(qkv, heads, key_mask, cu_seqlens, max_seqlen, scale, rope_cos, rope_sin, window, dropout_p):
    # all that decides the bound launches but the sizes: dtypes, devices, alignment, the strides that do
    # not follow the sizes, the options (read in a few microseconds; the launchers' work is skipped)
    if rope_cos is not None and rope_sin is not None:
        rope = (rope_cos.shape[1], rope_cos.stride(), rope_cos.dtype, rope_cos.device, rope_cos.data_ptr() % 16,
                rope_sin.shape[1], rope_sin.stride(), rope_sin.dtype, rope_sin.device, rope_sin.data_ptr() % 16)
    else:
        rope = (rope_cos is None, rope_sin is None)
    if cu_seqlens is not None:
        layout = ("varlen", cu_seqlens.dtype, cu_seqlens.device, cu_seqlens.stride(0))
    elif key_mask is not None:
        layout = ("masked", key_mask.dtype, key_mask.device, key_mask.stride(-1))
    else:  # whether the tiles divide seq (powers of 2 up to 256): the EVEN kernels or not
        layout = ("padded", min(max_seqlen & -max_seqlen, 256))
    local = window is not None and 0 <= window < max_seqlen - 1  # a window short of the longest sequence
    return (qkv.stride(), qkv.shape[1], qkv.dtype, qkv.device, qkv.data_ptr() % 16, heads, scale,
            window if local else -1, dropout_p, layout, rope)


def _rows_key(t):
    return (t.dim(), t.stride()[-2:], t.dtype, t.data_ptr() % 16)


def _bound(key, bind, *args):
    # the launches kept for `key`, bound by bind(*args) at its first call (None: the launchers run it)
    found = _BOUND.get(key, False)
    if found is False:
        if len(_BOUND) >= _BOUND_LIMIT:
            _BOUND.clear()
        found = _BOUND[key] = bind(*args)
    return found


def _heads(rows: torch.Tensor, heads: int, seq: int, varlen: bool) -> torch.Tensor:
    # rows [..., heads * d] of tokens (varlen) or of batch x seq positions as the launchers' [T, H, d]
    # or [B, H, S, d] (a view)
    d = rows.shape[-1] // heads
    if varlen:
        return rows.view(-1, heads, d)
    return rows.view(-1, seq, heads, d).transpose(1, 2)


def _qkv(qkv: torch.Tensor, heads: int, seq: int, varlen: bool):
    # q, k, v as views of the QKV rows: varlen [T, H, d] each, padded [B, H, S, d] each
    d = qkv.shape[-1] // (3 * heads)
    if varlen:
        return qkv.view(-1, 3, heads, d).unbind(1)
    return qkv.view(-1, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)


def _runs_bound(qkv, key_mask, cu_seqlens, max_seqlen, rope_cos) -> bool:
    # a problem the bound launches take as they are (else the launchers: an empty one, rotary tables
    # shorter than the sequences, for their errors; one of a single row or position, whose strides
    # the launchers pass as 0 and which must not be what a specialization is bound from)
    if max_seqlen <= 1 or qkv.shape[0] <= 1 or (rope_cos is not None and rope_cos.shape[0] < max_seqlen):
        return False
    if cu_seqlens is not None:
        return cu_seqlens.shape[0] >= 2
    return qkv.shape[0] % max_seqlen == 0 and (key_mask is None or tuple(key_mask.shape) == (qkv.shape[0] // max_seqlen,
                                                                                               max_seqlen))


def qkv_attention_forward(
    qkv: torch.Tensor,
    heads: int,
    key_mask: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    max_seqlen: int,
    scale: float,
    rope_cos: Optional[torch.Tensor] = None,
    rope_sin: Optional[torch.Tensor] = None,
    window: int = -1,
    *,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    keep_lse: bool = False,
    lse_out: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Attention over the joined QKV rows of a layer: qkv [rows, 3 * hidden] (rows: batch * seq
    padded, or the packed tokens with cu_seqlens, int32 [B + 1]; seq: max_seqlen), each third
    [rows, heads, head_dim] by its rows; key_mask: None or bool [batch, seq] (padded only).
    dropout_p, seed, rope_cos, rope_sin, window: as varlen_attention_forward's. out: where the
    context rows go ([rows, hidden] or [batch, seq, hidden], unit last stride), or None: over the
    queries (for inference: the context is then qkv's first third); keep_lse: keep the log-sum-exp
    for qkv_attention_backward (fresh fp32: [heads, T] packed, [B, heads, S] padded), else nothing
    is kept; lse_out: where the kept log-sum-exp goes (fp32 contiguous, its shape), for a caller that
    allocates a step's tensors at once (kernels.empty_parts). -> (the context rows, the log-sum-exp
    or None).

    The result of attention_forward / varlen_attention_forward on the views, bit for bit, through
    the same launches, whose arguments are bound once per specialization (kernels.Bound: dtypes,
    options, alignment; not the sizes): a call computes its key, the views, its fresh outputs, the
    sizes' arguments and the launch (with a key mask, the range kernel's first), nothing else. A
    specialization the kernels cannot take as it is (a tensor not 16-byte aligned) runs those
    launchers at every call."""
    rows, width = qkv.shape
    varlen = cu_seqlens is not None
    q, k, v = _qkv(qkv, heads, max_seqlen, varlen)
    o = q if out is None else _heads(out, heads, max_seqlen, varlen)
    bound = None
    if _runs_bound(qkv, key_mask, cu_seqlens, max_seqlen, rope_cos):
        key = ("fwd", _specialization(qkv, heads, key_mask, cu_seqlens, max_seqlen, scale, rope_cos, rope_sin, window,
                                      dropout_p), None if out is None else _rows_key(out), keep_lse)
        bound = _bound(key, _bind_forward, q, k, v, o, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed,
                       rope_cos, rope_sin, window, keep_lse)
    if bound is None:
        if varlen:
            _, lse, _ = varlen_attention_forward(q, k, v, cu_seqlens.contiguous(), max_seqlen, scale, dropout_p, seed,
                                                 False, rope_cos, rope_sin, window, out=o, keep_lse=keep_lse)
        else:
            _, lse, _ = attention_forward(q, k, v, key_mask, scale, dropout_p, seed, False, rope_cos, rope_sin, window,
                                          out=o, keep_lse=keep_lse)
        if keep_lse and lse_out is not None:
            lse = lse_out.copy_(lse)
    else:
        ranges, forward, block_m = bound
        values = _values(qkv, o, q, k, v, heads, key_mask, cu_seqlens, max_seqlen, rope_cos, rope_sin,
                         dropout_options(dropout_p, seed, "attention").seed)
        batch = values["batch"]
        shape = (heads, rows) if varlen else (batch, heads, max_seqlen)
        if keep_lse and lse_out is not None:
            lse = fresh_or_given(lse_out, shape, torch.float32, qkv.device, "lse_out")
        else:
            lse = _lse(shape, keep_lse, qkv.device)
        values["LSE"] = lse
        _find_ranges(ranges, values)
        forward((cdiv(max_seqlen, block_m), heads, batch), values)
        lse = lse if keep_lse else None
    return (qkv.narrow(1, 0, width // 3) if out is None else out), lse


def qkv_attention_backward(
    dout: torch.Tensor,
    qkv: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    heads: int,
    key_mask: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    max_seqlen: int,
    scale: float,
    rope_cos: Optional[torch.Tensor] = None,
    rope_sin: Optional[torch.Tensor] = None,
    window: int = -1,
    *,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    grad_out: Optional[torch.Tensor] = None,
    delta_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The gradient of qkv [rows, 3 * hidden], fresh, for qkv_attention_forward(..., out=out,
    keep_lse=True): dout, out: the context rows' gradient and the context rows (unit last stride);
    lse: the forward's; every other argument the forward's. dq, dk, dv are written into its three
    thirds (where splitting qkv by autograd would stack them: a copy). Bound once per
    specialization, as the forward. For a caller that allocates a step's tensors at once
    (kernels.empty_parts): grad_out, where the gradient goes (qkv's shape and dtype, contiguous);
    delta_out, the backward's row sums' memory (fp32 contiguous, lse's shape; the bound launches
    use it, the launchers their own)."""
    rows, width = qkv.shape
    varlen = cu_seqlens is not None
    q, k, v = _qkv(qkv, heads, max_seqlen, varlen)
    do, o = _heads(dout, heads, max_seqlen, varlen), _heads(out, heads, max_seqlen, varlen)
    dqkv = fresh_or_given(grad_out, (rows, width), qkv.dtype, qkv.device, "grad_out")
    grads = _qkv(dqkv, heads, max_seqlen, varlen)
    bound = None
    if _runs_bound(qkv, key_mask, cu_seqlens, max_seqlen, rope_cos):
        key = ("bwd", _specialization(qkv, heads, key_mask, cu_seqlens, max_seqlen, scale, rope_cos, rope_sin, window,
                                      dropout_p), _rows_key(dout), _rows_key(out), lse.dtype, lse.is_contiguous())
        bound = _bound(key, _bind_backward, do, q, k, v, o, lse, key_mask, cu_seqlens, max_seqlen, scale, dropout_p,
                       seed, rope_cos, rope_sin, window, grads)
    if bound is None:
        if varlen:
            varlen_attention_backward(do, q, k, v, o, lse, cu_seqlens.contiguous(), max_seqlen, scale, dropout_p, seed,
                                      rope_cos, rope_sin, window, grads=grads)
        else:
            attention_backward(do, q, k, v, o, lse, key_mask, scale, dropout_p, seed, rope_cos, rope_sin, window,
                               grads=grads)
        return dqkv
    ranges, launches = bound
    values = _values(qkv, o, q, k, v, heads, key_mask, cu_seqlens, max_seqlen, rope_cos, rope_sin,
                     dropout_options(dropout_p, seed, "attention").seed)
    batch = values["batch"]
    dq, dk, dv = grads
    d_rows = dqkv.stride(0)
    delta = fresh_or_given(delta_out, lse.shape, torch.float32, qkv.device, "delta_out")
    values.update(LSE=lse, DELTA=delta, DO=do, DQ=dq, DK=dk, DV=dv, rows_total=rows if varlen else max_seqlen,
                  stride_dob=max_seqlen * dout.stride(-2), stride_dqb=max_seqlen * d_rows,
                  stride_dkb=max_seqlen * d_rows, stride_dvb=max_seqlen * d_rows)
    _find_ranges(ranges, values)
    for bound, block, rows_grid in launches:
        grid_rows = rows if rows_grid and varlen else max_seqlen
        bound((cdiv(grid_rows, block), heads, 1 if rows_grid and varlen else batch), values)
    return dqkv


def _values(qkv, o, q, k, v, heads, key_mask, cu_seqlens, max_seqlen, rope_cos, rope_sin, seed) -> dict:
    """The varying arguments of a call (_VARYING) both directions share, and its batch size."""
    rows = qkv.shape[0]
    values = {"OUT": o, "Q": q, "K": k, "V": v, "seq": max_seqlen, "seed": seed, "ROPE_COS": rope_cos,
              "ROPE_SIN": rope_sin}
    if cu_seqlens is not None:
        values.update(CU_SEQLENS=cu_seqlens, stride_lh=rows, batch=cu_seqlens.shape[0] - 1)
        return values
    batch = rows // max_seqlen
    step = max_seqlen * qkv.stride(0)
    values.update(MASK=key_mask, stride_mb=0 if key_mask is None else key_mask.stride(0), stride_lb=heads * max_seqlen,
                  stride_lh=max_seqlen, stride_ob=max_seqlen * o.stride(-2), stride_qb=step, stride_kb=step,
                  stride_vb=step, batch=batch)
    return values


def _find_ranges(ranges: Optional[Bound], values: dict) -> None:
    # a key mask's ranges, found by its bound launch, into values (nothing without one)
    if ranges is not None:
        mask = values["MASK"]
        values["RANGES"] = found = torch.empty((mask.shape[0], 2), dtype=torch.int32, device=mask.device)
        ranges((mask.shape[0],), {"RANGES": found, "MASK": mask, "stride_mb": values["stride_mb"],
                                  "seq": values["seq"]})


def _bind_layout(q, k, v, tensors, key_mask, cu_seqlens, max_seqlen, rope_cos, rope_sin, window, even_kernels):
    """What the forward and the backward bind alike: (rope, dist, the mask ranges' Bound or None,
    the ranges the launchers would take, the varying arguments' names), or None where the launchers
    would not launch as bound here (a tensor to copy, an all-true mask made at each call). tensors:
    every [.., heads, d] view the launches read or write (q, k, v among them)."""
    varlen = cu_seqlens is not None
    d = q.shape[-1]
    row = -3 if varlen else -2  # the views' row (token) dim
    # 16-byte aligned at every size: the pointers and every stride but the last
    if (d % 16 or (varlen and cu_seqlens.stride(0) != 1)
            or any(t.data_ptr() % 16 or t.stride(-1) != 1 or t.stride(row) % 16 for t in tensors)):
        return None
    rope = rope_tables(rope_cos, rope_sin, d, max_seqlen, q.device)
    if rope is not None and (rope[0] is not rope_cos or rope[1] is not rope_sin):
        return None
    dist = distance_options(window, None, q.shape[-2] if varlen else q.shape[1], max_seqlen, q.device)
    varying = set(_VARYING["varlen" if varlen else "padded"])
    if rope is None:
        varying -= {"ROPE_COS", "ROPE_SIN"}
    if varlen:
        return rope, dist, None, None, varying
    if key_mask is None:
        varying -= {"MASK", "RANGES", "stride_mb"}
        variant = (rope is not None, dist.local)
        if not _is_even(max_seqlen, *(settings(d, q.dtype, kernel, *variant) for kernel in even_kernels)):
            return None  # the launchers make an all-true mask at each call
        return rope, dist, None, None, varying
    if key_mask.dtype != torch.bool:
        return None
    found = torch.empty((key_mask.shape[0], 2), dtype=torch.int32, device=q.device)
    s = RANGE_SETTINGS
    ranges = Bound(mask_range_kernel, (found, key_mask, key_mask.stride(0), max_seqlen),
                   dict(BLOCK=s.block_n, **s.options()), ("RANGES", "MASK", "stride_mb", "seq"))
    return rope, dist, ranges, found, varying


def _names(kernel, varying) -> tuple:
    return tuple(name for name in kernel.arg_names if name in varying)


def _bind_forward(q, k, v, o, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, rope_cos, rope_sin, window,
                  keep_lse):
    """qkv_attention_forward's launches for this specialization: (the range kernel's Bound or
    None, the forward's Bound, its tile's rows), as attention_forward / varlen_attention_forward
    make them; None where those launch otherwise (_bind_layout)."""
    layout = _bind_layout(q, k, v, (q, k, v, o), key_mask, cu_seqlens, max_seqlen, rope_cos, rope_sin, window,
                          ("fwd",))
    if layout is None:
        return None
    rope, dist, ranges, found, varying = layout
    drop = dropout_options(dropout_p, seed, "attention")
    if cu_seqlens is not None:
        total, heads = q.shape[:2]
        batch, lse_shape, lse_strides = cu_seqlens.shape[0] - 1, (heads, total), (1, total)
        strides = tuple(_varlen_strides(t) for t in (q, k, v, o))
    else:
        batch, heads, seq = q.shape[:3]
        lse_shape, lse_strides = (batch, heads, seq), (heads * seq, seq)
        strides = tuple(_padded_strides(t) for t in (q, k, v, o))
    kernel, _, args, options = _forward_launch(q, k, v, o, _lse(lse_shape, keep_lse, q.device), lse_strides, None,
                                                  key_mask, found, cu_seqlens, batch, max_seqlen, strides, scale, drop,
                                                  rope, dist)
    return ranges, Bound(kernel, args, options, _names(kernel, varying)), options["BLOCK_M"]


def _bind_backward(do, q, k, v, o, lse, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, rope_cos, rope_sin,
                   window, grads):
    """qkv_attention_backward's launches for this specialization: (the range kernel's Bound or None,
    ((Bound, the grid's tile, whether its grid runs over the rows (the preprocessing)) of the three
    backward kernels)), as attention_backward / varlen_attention_backward make them; None where
    those launch otherwise (_bind_layout)."""
    layout = _bind_layout(q, k, v, (do, q, k, v, o, *grads), key_mask, cu_seqlens, max_seqlen, rope_cos, rope_sin,
                          window, ("bwd_dkdv", "bwd_dq"))
    if layout is None:
        return None
    rope, dist, ranges, found, varying = layout
    drop = dropout_options(dropout_p, seed, "attention")
    if cu_seqlens is not None:
        batch, lse_strides, strides_of = cu_seqlens.shape[0] - 1, (1, lse.stride(0)), _varlen_strides
    else:
        batch, lse_strides, strides_of = q.shape[0], lse.stride()[:2], _padded_strides
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    launches = _backward_launches(do, q, k, v, o, lse, delta, lse_strides, key_mask, found, cu_seqlens, batch,
                                  max_seqlen, strides_of, scale, drop, rope, dist, grads, dist.grad_buffer(q.device))
    bound = []
    for kernel, _, args, options in launches:
        preprocess = kernel is attention_bwd_preprocess_kernel
        block = options["BLOCK_M"] if preprocess or kernel is attention_bwd_dq_kernel else options["BLOCK_N"]
        bound.append((Bound(kernel, args, options, _names(kernel, varying)), block, preprocess))
    return ranges, tuple(bound)
