"""Flash attention with a padding mask, padded and packed (varlen), forward and backward.

    out = softmax(q k^T * scale (+ rel[j - i]), padded keys masked) v, with dropout on the
    probabilities, optionally q, k first rotated by rotary position embeddings (RoPE), each
    query seeing only the keys within a window (local attention), and a relative position
    bias added to the scores.

This module holds the launchers `attention_forward` / `attention_backward` /
`varlen_attention_forward` / `varlen_attention_backward` (plain Python; inputs arrive validated:
q, k, v of one shape, dtype and device, last dim contiguous) and exposes the launch settings and
`report_configs`. The rest lives beside it: `attention_common` (jit helpers shared by the
kernels, and the kernel that finds a key mask's real range), `attention_rope` (the jit functions
of rotary embeddings), `attention_distance` (those of the window and the relative bias),
`attention_fwd` (the forward kernel), `attention_bwd` (the backward kernels), `attention_args`
(the launchers' optional arguments put in the kernels' form), `attention_settings` (the launch
settings table) and `attention_report` (`report_configs`).

Forward: one program per (query tile of BLOCK_M rows, head, sequence) walks the sequence's keys
in tiles of BLOCK_N with an online softmax in fp32; the [seq x seq] score matrix never leaves
registers. Scores live in the log2 domain (scale * log2(e) folded into one multiply-add), and each
row's log2-sum-exp2 `lse` is saved for the backward (fp32, [batch, heads, seq] padded,
[heads, total_tokens] varlen). Backward: a preprocessing kernel computes delta = rowsum(dO * O)
(fp32, lse's layout); then one kernel gives dq (one program per query tile, looping over the key
tiles) and one gives dk, dv (one program per key tile, looping over the query tiles): no atomics,
so the gradients are deterministic. delta from the stored (rounded) O is off by dO . (O - round(O)),
which leaves a gradient of that size where the true one is 0 (a query with one real key: about
1e-3 in fp16, 8x more in bf16). So the dq kernel also sums rowsum(p * dp), rowsum(p) and p k as
it goes, corrects dq at the end with the exact delta = rowsum(p * dp) / rowsum(p) (one more tile
product per step; the rounded delta only centres the values it multiplies, keeping the
cancellation out of the 16-bit products), and stores it for the dk / dv kernel, which runs after.

Padding. Each sequence's real positions lie in [lo, hi): padded layout with a key mask, the range
from its first to one past its last real token (computed on the device by `_mask_range_kernel`, no
host sync; lo = hi = 0 for a row with none); varlen, [0, length) counted from the sequence's first
token (cu_seqlens[b]). Key tiles start at lo and stop at hi, so tiles wholly in padding are never
visited; within [lo, hi) the key mask itself is loaded, so masks with holes stay exact. A query
tile wholly outside [lo, hi) runs no key loop and writes zeros (padded layout) or nothing (varlen:
those rows belong to the next sequence). A query row that outputs zeros (padding, or a hole in
the mask) stores lse = +inf, so the backward's probabilities exp2(s - lse) are exactly 0 on it: it
passes no gradient to q, k or v, and nothing is ever NaN. Masked keys (holes) are handled in the
dk/dv kernel without a per-element select: each program owns its key tile, a key column only ever
feeds its own rows of dk and dv, and those rows are zeroed at the end.

Variants. Three layouts are compiled: EVEN (padded, no mask, S a multiple of both tile sizes: no
bounds checks at all), HAS_MASK (padded with a key mask; a batch with no mask whose S is not a
multiple of the tiles runs it too, with every token real, so S is a runtime int in every variant
and a new length never compiles anything), and VARLEN. head_dim is a runtime int (a multiple of
16) under a power-of-2 block BLOCK_D >= 32 (columns past head_dim masked), so 80, 96 and 128
share a variant. HAS_DROPOUT, RETURN_MASK (forward, not EVEN), ROPE, WINDOW and REL_BIAS are
constexpr flags too.

Local attention (WINDOW, window = w: query i sees the keys j with |i - j| <= w, positions as
rotary's below) and the relative bias (REL_BIAS, rel [H, 2n - 1], n >= S or max_seqlen: the
scaled score of (i, j) gets rel[h, j - i + n - 1]), `attention_distance`. A window of S - 1 or
more (max_seqlen - 1 varlen) reaches every key: it runs the kernels without WINDOW. With one, a
query tile visits only the key tiles (of lo's grid) that hold a key within w of one of its rows,
and the dk / dv kernel's key tile only the query tiles within w of one of its keys: every other
tile is skipped, so the cost grows with the window, not the sequence; the partial tiles set the
scores out of the window to -inf, and a row that has met no key of its window yet keeps its
running max at -inf without making NaN. The bias is read inside the kernels by distance (an fp32
copy times log2(e), [H, 2n - 1]: nothing of [H, S, S] is ever formed), and its gradient drel,
the sum of dS over each diagonal, comes from the dk / dv kernel (the exact delta is there): a
16-bit kernel's tile of dS is skewed so that its diagonals are columns, summed, and added
atomically into fp32 [H, 2n - 1] (one atomic per diagonal per tile pair), an fp32 kernel's small
tile element by element (its sum order, and so its last bits, vary from run to run). Masked keys
have their columns of dS zeroed first (the dk / dv kernel otherwise leaves them unmasked, above).

Rotary embeddings (ROPE, given rope_cos / rope_sin, fastbert.reference.rotary): q and k are
rotated in registers as their tiles are loaded (no rotated copy is written), at positions = the
tile's row indices from the sequence's offset (padded: the row, padding included; varlen: the
index within the sequence), by the fp32 tables [P, D / 2] read with the tile's own mask. RoPE
pairs column i with i + D/2 and register tiles cannot be permuted along their columns, so a
rotated tile is held as its two halves, [rows, BLOCK_D / 2] each (columns past D/2 masked; the
halves are at least 16 wide, as tl.dot needs, since BLOCK_D >= 32): rotated in fp32, cast to the
input dtype, and q k^T = q_a k_a^T + q_b k_b^T (one chained product, the same FLOPs). dq and dk
accumulate as the two halves of the gradient of the rotated tile and are rotated back (the
transpose) as they are stored; v, dv and everything else are unchanged. Every head dim above
takes ROPE, 16 included (halves of 8 in 16-wide blocks). Its jit functions live in
`attention_rope`; with ROPE off they are the plain loads, products and stores, and compile to the
same code as without them.

Dropout follows fastbert.reference bit for bit: probability (b, h, i, j) has the Philox counter
offset = (b * heads + h) * 2**32 + ((i - lo) & 0xFFFF) * 2**16 + ((j - lo) & 0xFFFF), i.e.
tl.randint(seed, offset), built here as its two 32-bit words and passed to tl.philox (what
tl.randint does with an int64 offset) so that no int64 tile is formed; it is kept when
(u >> 8) >= floor(p * 2**24). It acts on the normalised probabilities (the row sum l includes the
dropped ones; kept ones are scaled by 1 / (1 - p)); the backward regenerates it. With
return_dropout_mask the forward also writes the keep-mask (a debug path: each program first
writes its rows of the [S x S] block, every column, and its key loop then reads its mask back
from there instead of drawing it).

Matrix products accumulate in fp32; fp16 / bf16 inputs feed the tensor cores directly, fp32 inputs
use input_precision="tf32x3" on the GPU (three TF32 tensor-core products, about fp32 accuracy) and
"ieee" under the interpreter (which computes every product exactly in fp32 anyway).
Strides: the kernels are built for 16-byte aligned q, k, v, dO with every stride a multiple of 16
elements (true of contiguous tensors and of views into a fused [B, S, 3, H, D] projection);
anything else is copied first (`_aligned`). Offsets of whole sequences and heads are int64.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from .attention_args import _LOG2E, _Distance, _distance, _dropout, _optional, _rope, _rope_args
from .attention_bwd import _attention_bwd_dkdv_kernel, _attention_bwd_dq_kernel, _attention_bwd_preprocess_kernel
from .attention_common import _mask_range_kernel
from .attention_fwd import _attention_fwd_kernel
from .attention_report import report_configs
from .attention_settings import (
    _RANGE_SETTINGS,
    BLOCK_DS,
    HEAD_DIMS,
    KERNELS,
    Settings,
    _dot_precision,
    _launch_options,
    block_d,
    settings,
)

__all__ = [
    "attention_forward", "attention_backward", "varlen_attention_forward", "varlen_attention_backward",
    "Settings", "HEAD_DIMS", "BLOCK_DS", "KERNELS", "block_d", "settings", "report_configs",
]


# --------------------------------------------------------------------------------------------
# Launchers


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself when its data pointer is 16-byte aligned and every stride but the last (of a dim
    longer than 1) is a multiple of 16 elements, the specialization all the kernels are built for
    (vectorised rows); else a contiguous copy (every supported head dim is a multiple of 16)."""
    ok = t.data_ptr() % 16 == 0 and t.stride(-1) == 1
    ok = ok and all(st % 16 == 0 for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1)
    return t if ok else t.contiguous() if not t.is_contiguous() else t.clone()


def _strides(t: torch.Tensor) -> Tuple[int, ...]:
    # strides of all dims but the last; a dim of length 1 is never stepped along: 0
    return tuple(0 if n == 1 else st for n, st in zip(t.shape[:-1], t.stride()[:-1]))


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
    s = _RANGE_SETTINGS
    _mask_range_kernel[(batch,)](ranges, mask, mask.stride(0), seq, BLOCK=s.block_n, **_launch_options(s))
    return mask, ranges


_MAX_GRID_YZ = 65535  # CUDA's limit on grid axes 1 and 2 (heads, sequences)


def _check_grid(batch: int, heads: int) -> None:
    if batch > _MAX_GRID_YZ or heads > _MAX_GRID_YZ:
        raise ValueError(f"fastbert: the Triton attention kernels take at most {_MAX_GRID_YZ} sequences and "
                         f"{_MAX_GRID_YZ} heads per call, got {batch} and {heads}; split the batch")


def _is_even(seq: int, *tiles: Settings) -> bool:
    return all(seq % s.block_m == 0 and seq % s.block_n == 0 for s in tiles)


def _forward(q, k, v, out, lse, lse_strides, keep, mask, ranges, cu_seqlens, batch, seq, strides, scale, drop, rope,
             dist: _Distance):
    """Launch the forward kernel. strides: (batch, head, row) strides of q, k, v, out (varlen:
    (token, head, token)); seq: S, or max_seqlen with cu_seqlens; rope: None or (cos, sin) (_rope);
    dist: the window and relative bias (_distance)."""
    heads = q.shape[-2] if cu_seqlens is not None else q.shape[1]
    head_dim = q.shape[-1]
    _check_grid(batch, heads)
    s = settings(head_dim, q.dtype, "fwd", rope is not None, dist.local or dist.relative)
    device = q.device
    q_st, k_st, v_st, o_st = strides
    _attention_fwd_kernel[(triton.cdiv(seq, s.block_m), heads, batch)](
        out, *o_st,
        lse, *lse_strides,
        _optional(keep, torch.bool, device),
        q, *q_st, k, *k_st, v, *v_st,
        _optional(mask, torch.bool, device), mask.stride(0) if mask is not None else 0,
        _optional(ranges, torch.int32, device),
        _optional(cu_seqlens, torch.int32, device),
        *_rope_args(rope, device),
        *dist.args(device),
        heads, seq, head_dim,
        scale * _LOG2E,
        drop.seed, drop.threshold, drop.scale,
        BLOCK_M=s.block_m, BLOCK_N=s.block_n, BLOCK_D=block_d(head_dim),
        HAS_MASK=mask is not None, VARLEN=cu_seqlens is not None, HAS_DROPOUT=drop.on,
        RETURN_MASK=keep is not None, ROPE=rope is not None, WINDOW=dist.local, REL_BIAS=dist.relative,
        DOT_PRECISION=_dot_precision(q.dtype),
        **_launch_options(s),
    )


def _backward(do, q, k, v, out, lse, lse_strides, mask, ranges, cu_seqlens, batch, seq, strides_of, scale, drop, rope,
              dist: _Distance):
    """Launch the three backward kernels; (dq, dk, dv), fresh and contiguous, and drel (fp32
    [H, 2n - 1], the relative bias's gradient; empty without one). strides_of: a tensor's (batch,
    head, row) strides (_padded_strides or _varlen_strides); rope, dist: as _forward's."""
    varlen = cu_seqlens is not None
    heads = q.shape[-2] if varlen else q.shape[1]
    head_dim = q.shape[-1]
    _check_grid(batch, heads)
    device = q.device
    dq, dk, dv = (torch.empty(q.shape, dtype=q.dtype, device=device) for _ in range(3))
    delta = torch.empty_like(lse)
    o_st, do_st, g_st = strides_of(out), strides_of(do), strides_of(dq)

    # delta = rowsum(dO * O) over every row: [B, H, S] as B x H x S rows, varlen [T, H] as 1 x H x T
    s = settings(head_dim, q.dtype, "bwd_preprocess")
    if varlen:
        rows, pre_batch, pre_l, pre_o, pre_do = q.shape[0], 1, (0, lse_strides[1]), (0, *o_st[1:]), (0, *do_st[1:])
    else:
        rows, pre_batch, pre_l, pre_o, pre_do = seq, batch, lse_strides, o_st, do_st
    _attention_bwd_preprocess_kernel[(triton.cdiv(rows, s.block_m), heads, pre_batch)](
        delta, *pre_l, out, *pre_o, do, *pre_do, rows, head_dim,
        BLOCK_M=s.block_m, BLOCK_D=block_d(head_dim), **_launch_options(s),
    )

    common = (
        q, *strides_of(q), k, *strides_of(k), v, *strides_of(v), do, *do_st,
        lse, delta, *lse_strides,
        _optional(mask, torch.bool, device), mask.stride(0) if mask is not None else 0,
        _optional(ranges, torch.int32, device),
        _optional(cu_seqlens, torch.int32, device),
        *_rope_args(rope, device),
        *dist.args(device),
        heads, seq, head_dim,
        scale * _LOG2E, scale,
        drop.seed, drop.threshold, drop.scale,
    )
    flags = dict(BLOCK_D=block_d(head_dim), HAS_MASK=mask is not None, VARLEN=varlen, HAS_DROPOUT=drop.on,
                 ROPE=rope is not None, WINDOW=dist.local, REL_BIAS=dist.relative, DOT_PRECISION=_dot_precision(q.dtype))
    variant = (rope is not None, dist.local or dist.relative)
    # dq first: it also replaces delta by the exact rowsum(p * dp) that dk / dv then use
    s = settings(head_dim, q.dtype, "bwd_dq", *variant)
    _attention_bwd_dq_kernel[(triton.cdiv(seq, s.block_m), heads, batch)](
        dq, *g_st, *common, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **_launch_options(s),
    )
    s = settings(head_dim, q.dtype, "bwd_dkdv", *variant)
    drel = dist.grad_buffer(device)
    _attention_bwd_dkdv_kernel[(triton.cdiv(seq, s.block_n), heads, batch)](
        dk, *g_st, dv, *g_st, drel, *common, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **_launch_options(s),
    )
    return dq, dk, dv, drel


def _grads(dq, dk, dv, drel, rel_bias: Optional[torch.Tensor]):
    # (dq, dk, dv), and the relative bias's gradient in its dtype when there is one
    return (dq, dk, dv) if rel_bias is None else (dq, dk, dv, drel.to(rel_bias.dtype))


def _no_grads(q: torch.Tensor, rel_bias: Optional[torch.Tensor]):
    # the gradients of an empty problem: zeros
    return _grads(*(torch.zeros(q.shape, dtype=q.dtype, device=q.device) for _ in range(3)),
                  None if rel_bias is None else torch.zeros_like(rel_bias), rel_bias)


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
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
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
    """
    batch, heads, seq, head_dim = q.shape
    drop = _dropout(dropout_p, seed)
    rope = _rope(rope_cos, rope_sin, head_dim, seq, q.device)
    dist = _distance(window, rel_bias, heads, seq, q.device)
    out = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    keep = None
    if return_dropout_mask and drop.on:
        keep = torch.empty((batch, heads, seq, seq), dtype=torch.bool, device=q.device)
    if out.numel() == 0:
        return out, lse, keep
    q, k, v = (_aligned(t) for t in (q, k, v))
    # the debug mask output is built into the masked and varlen variants only
    even = keep is None and _is_even(seq, settings(head_dim, q.dtype, "fwd", rope is not None,
                                                   dist.local or dist.relative))
    mask, ranges = _key_mask(key_mask, batch, seq, q.device, even)
    strides = tuple(_padded_strides(t) for t in (q, k, v, out))
    _forward(q, k, v, out, lse, lse.stride()[:2], keep, mask, ranges, None, batch, seq, strides, scale, drop, rope,
             dist)
    return out, lse, keep


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
) -> Tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of attention_forward, [B, H, S, D] contiguous in q.dtype (zeros at padded
    positions), and with rel_bias its gradient drel (rel_bias's shape and dtype). do: the gradient
    of out; out, lse: from attention_forward; the same key_mask, scale, dropout_p, seed (the dropout
    mask is regenerated, not stored), rotary tables (dq, dk: the gradients of the unrotated q, k),
    window and rel_bias."""
    batch, heads, seq, head_dim = q.shape
    drop = _dropout(dropout_p, seed)
    rope = _rope(rope_cos, rope_sin, head_dim, seq, q.device)
    dist = _distance(window, rel_bias, heads, seq, q.device)
    if q.numel() == 0:
        return _no_grads(q, rel_bias)
    q, k, v, out, do = (_aligned(t) for t in (q, k, v, out, do))
    variant = (rope is not None, dist.local or dist.relative)
    even = _is_even(seq, *(settings(head_dim, q.dtype, kernel, *variant) for kernel in ("bwd_dkdv", "bwd_dq")))
    mask, ranges = _key_mask(key_mask, batch, seq, q.device, even)
    return _grads(*_backward(do, q, k, v, out, lse, lse.stride()[:2], mask, ranges, None, batch, seq, _padded_strides,
                             scale, drop, rope, dist), rel_bias)


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
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(out, lse, keep) of attention over packed sequences.

    q, k, v: [T, H, D], sequence b = tokens cu_seqlens[b]:cu_seqlens[b + 1] (int32 [B + 1], on
    q's device, cu_seqlens[B] = T); max_seqlen >= every length. out: [T, H, D] contiguous; lse:
    fp32 [H, T]; keep: bool [B, H, max_seqlen, max_seqlen] (sequence b in its top-left corner;
    the whole block follows the dropout rule) when return_dropout_mask and dropout_p > 0, else None.
    rope_cos, rope_sin: None, or rotary tables (fp32 [P >= max_seqlen, D / 2]) by which q and k are
    rotated at each token's position within its sequence. window, rel_bias: as attention_forward's
    (n >= max_seqlen), positions counted within each sequence.
    """
    total, heads, head_dim = q.shape
    batch = cu_seqlens.shape[0] - 1
    drop = _dropout(dropout_p, seed)
    rope = _rope(rope_cos, rope_sin, head_dim, max_seqlen, q.device)
    dist = _distance(window, rel_bias, heads, max_seqlen, q.device)
    out = torch.empty((total, heads, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((heads, total), dtype=torch.float32, device=q.device)
    keep = None
    if return_dropout_mask and drop.on:
        keep = torch.empty((batch, heads, max_seqlen, max_seqlen), dtype=torch.bool, device=q.device)
    if batch <= 0 or heads == 0 or max_seqlen <= 0:
        return out, lse, keep
    q, k, v = (_aligned(t) for t in (q, k, v))
    strides = tuple(_varlen_strides(t) for t in (q, k, v, out))
    _forward(q, k, v, out, lse, (1, lse.stride(0)), keep, None, None, cu_seqlens, batch, max_seqlen, strides,
             scale, drop, rope, dist)
    return out, lse, keep


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
) -> Tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of varlen_attention_forward: [T, H, D] contiguous in q.dtype, and with
    rel_bias its gradient drel; the same cu_seqlens, max_seqlen, scale, dropout_p, seed, rotary
    tables, window and rel_bias as the forward."""
    batch = cu_seqlens.shape[0] - 1
    drop = _dropout(dropout_p, seed)
    rope = _rope(rope_cos, rope_sin, q.shape[-1], max_seqlen, q.device)
    dist = _distance(window, rel_bias, q.shape[1], max_seqlen, q.device)
    if batch <= 0 or max_seqlen <= 0 or q.numel() == 0:
        return _no_grads(q, rel_bias)
    q, k, v, out, do = (_aligned(t) for t in (q, k, v, out, do))
    return _grads(*_backward(do, q, k, v, out, lse, (1, lse.stride(0)), None, None, cu_seqlens, batch, max_seqlen,
                             _varlen_strides, scale, drop, rope, dist), rel_bias)
