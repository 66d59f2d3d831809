"""DeBERTa's disentangled attention (deberta-v2 / v3): content-to-content scores plus the
content-to-position and position-to-content terms, each read from a table per head (q against the
position keys, k against the position queries) at the row of the bucketed distance
(fastbert.layouts.deberta_position_rows), then the padding mask, softmax, dropout and the values.

    disentangled_attention(q, k, v, attention_mask=None, *, pos_key=None, pos_query=None, ...)
        q, k, v: [batch, heads, seq, head_dim]; returns [batch, heads, seq, head_dim]
    varlen_disentangled_attention(q, k, v, cu_seqlens, max_seqlen, *, pos_key=None, pos_query=None, ...)
        q, k, v: [total_tokens, heads, head_dim], sequences packed as for fastbert.ops.varlen_attention

The fused backends read the terms inside the attention kernel, never a [seq, seq] tensor of them:
"cpp" (csrc/kernels/attention_*.cpp) makes per (sequence, head) the products of q and k with the
table rows that sequence's distances reach, [len, 2 len - 1], and reads them by distance as the
scores are made; "triton" (kernels/disentangled_attention.py) makes per tile the products with the
rows of the tile's distances and gathers them, in float16 / bfloat16 at head dims up to 64 (fp32
and wider heads spill registers there). Both backwards give the tables' gradients too. The "torch"
backend, what the Triton kernels do not take, and every call asking for the probabilities run
fastbert.reference.disentangled_attention.

Layers: custom ops (opaque to torch.compile) -> autograd Function -> functional API.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from fastbert import backend as fb_backend
from fastbert import reference
from fastbert.layouts import deberta_position_rows
from fastbert.ops.attention import check_cu_seqlens, torch_keep_mask
from fastbert.ops.checks import check_device, check_float, check_int, check_mask, check_prob
from fastbert.ops.common import fused_op, needs_grad, op_seed, save_seed, saved_seed, seed_int
from fastbert.ops.padding import heads_packed, heads_padded
from fastbert.reference.disentangled_attention import attention_at_rows

OP = "disentangled_attention"
Tensor = torch.Tensor

# --------------------------------------------------------------------------------------------
# custom ops: the fused launchers behind one schema, both layouts (packed when cu_seqlens is given)


def _lse_like(q: Tensor, packed: bool) -> Tensor:
    return q.new_empty((q.shape[1], q.shape[0]) if packed else q.shape[:3], dtype=torch.float32)


def _fake_fwd(q, k, v, key_mask, cu_seqlens, pos_key, pos_query, pos_index, scale, dropout_p, seed, backend):
    return q.new_empty(q.shape), _lse_like(q, cu_seqlens is not None)


@fused_op("disentangled_attention_fwd", _fake_fwd)
def disentangled_attention_fwd(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], cu_seqlens: Optional[Tensor],
                               pos_key: Optional[Tensor], pos_query: Optional[Tensor], pos_index: Tensor, scale: float,
                               dropout_p: float, seed: Optional[Tensor], backend: str) -> Tuple[Tensor, Tensor]:
    out, lse = fb_backend.impl(backend, "disentangled_attention").disentangled_attention_forward(
        q, k, v, key_mask, cu_seqlens, pos_key, pos_query, pos_index, scale, dropout_p, seed_int(seed))
    return out, lse


def _table_grad_like(t: Optional[Tensor], q: Tensor) -> Tensor:
    return t.new_empty(t.shape) if t is not None else q.new_empty((0,), dtype=torch.float32)


def _fake_bwd(do, q, k, v, out, lse, key_mask, cu_seqlens, pos_key, pos_query, pos_index, scale, dropout_p, seed,
              backend):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _table_grad_like(pos_key, q),
            _table_grad_like(pos_query, q))


@fused_op("disentangled_attention_bwd", _fake_bwd)
def _disentangled_attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                key_mask: Optional[Tensor], cu_seqlens: Optional[Tensor], pos_key: Optional[Tensor],
                                pos_query: Optional[Tensor], pos_index: Tensor, scale: float, dropout_p: float,
                                seed: Optional[Tensor], backend: str
                                ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(fb_backend.impl(backend, "disentangled_attention").disentangled_attention_backward(
        do, q, k, v, out, lse, key_mask, cu_seqlens, pos_key, pos_query, pos_index, scale, dropout_p, seed_int(seed)))


class DisentangledFunction(torch.autograd.Function):
    """Both layouts through one Function: padded (key_mask, cu_seqlens None) or packed (cu_seqlens)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, cu_seqlens, pos_key, pos_query, pos_index, scale, dropout_p, seed, backend):
        out, lse = disentangled_attention_fwd(q, k, v, key_mask, cu_seqlens, pos_key, pos_query, pos_index, scale,
                                              dropout_p, seed, backend)
        ctx.save_for_backward(q, k, v, out, lse, key_mask, cu_seqlens, pos_key, pos_query, pos_index,
                              save_seed(ctx, seed))
        ctx.scale, ctx.dropout_p, ctx.backend = scale, dropout_p, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, key_mask, cu_seqlens, pos_key, pos_query, pos_index, seed = ctx.saved_tensors
        dq, dk, dv, dpk, dpq = _disentangled_attention_bwd(
            dout.contiguous(), q, k, v, out, lse, key_mask, cu_seqlens, pos_key, pos_query, pos_index, ctx.scale,
            ctx.dropout_p, saved_seed(ctx, seed), ctx.backend)
        dpk = dpk if pos_key is not None and ctx.needs_input_grad[5] else None
        dpq = dpq if pos_query is not None and ctx.needs_input_grad[6] else None
        return dq, dk, dv, None, None, dpk, dpq, None, None, None, None, None


# --------------------------------------------------------------------------------------------
# the functional API


@functools.lru_cache(maxsize=64)
def position_index(n: int, position_buckets: int, max_relative_positions: int) -> Tuple[Tensor, int, int]:
    """(index, lo, hi): the table row of each distance i - j of sequences up to n long, as
    deberta_position_rows gives it, less lo (int32 [2n - 1], on the CPU), and the rows [lo, hi) the
    distances reach. A pure function of its arguments, never written to: nothing makes it stale."""
    with torch.inference_mode(False):
        rows = deberta_position_rows(max(n, 1), position_buckets, max_relative_positions)
        lo, hi = int(rows[0]), int(rows[-1]) + 1  # the rows are non-decreasing in the distance
        return (rows - lo).to(torch.int32), lo, hi


def _check(q, k, v, dims: int, layout: str, position_buckets, max_relative_positions, dropout_p):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(OP, name, t)
        if t.dim() != dims or t.shape != q.shape:
            raise ValueError(f"fastbert.ops.{OP}: q, k and v must be {layout} of one shape, "
                             f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    buckets = check_int(OP, "position_buckets", position_buckets, -(1 << 30))
    furthest = check_int(OP, "max_relative_positions", max_relative_positions, 1)
    return buckets, furthest, check_prob(OP, "dropout_p", dropout_p)


def _tables(q, n: int, pos_key, pos_query, buckets: int, furthest: int):
    """(index, pos_key, pos_query): position_index's index for sequences up to n long and the
    tables' rows it reaches, [lo, hi): each table is given whole, [heads, 2 span, head_dim], and cut
    here, or as those rows alone, [heads, hi - lo, head_dim] (a model that projects only them)."""
    index, lo, hi = position_index(n, buckets, furthest)
    span = buckets if buckets > 0 else furthest
    heads, d = q.shape[-3 if q.dim() == 4 else -2], q.shape[-1]
    cut = []
    for name, t in (("pos_key", pos_key), ("pos_query", pos_query)):
        if t is not None:
            check_float(OP, name, t)
            check_device(OP, name, t, q, like="q")
            if tuple(t.shape) == (heads, 2 * span, d):
                t = t[:, lo:hi]
            elif tuple(t.shape) != (heads, hi - lo, d):
                raise ValueError(f"fastbert.ops.{OP}: {name} must be [heads, 2 span, head_dim] = "
                                 f"{(heads, 2 * span, d)} (or the {hi - lo} rows [{lo}, {hi}) that lengths up to {n} "
                                 f"reach, fastbert.ops.disentangled_attention.position_index), got {tuple(t.shape)}")
        cut.append(t)
    return index, cut[0], cut[1]


def _default_scale(scale, d: int, pos_key, pos_query) -> float:
    return (d * (1 + (pos_key is not None) + (pos_query is not None))) ** -0.5 if scale is None else float(scale)


def _formulation(backend: str, q: Tensor, pos_key, pos_query) -> bool:
    """Whether a call runs the PyTorch formulation: the torch backend, no position term, no rows, or
    what the Triton kernels do not take (they take float16 / bfloat16 and head dims up to 64)."""
    if backend == "torch" or (pos_key is None and pos_query is None) or q.numel() == 0:
        return True
    return backend == "triton" and not fb_backend.impl(backend, "disentangled_attention").disentangled_takes(q.dtype, q.shape[-1])


def _fused(q, k, v, mask, cu_seqlens, pos_key, pos_query, index, scale, p, seed, backend):
    args = (q, k, v, mask, cu_seqlens, pos_key, pos_query, index, scale, p, seed, backend)
    if needs_grad(q, k, v, *(t for t in (pos_key, pos_query) if t is not None)):
        return DisentangledFunction.apply(*args)
    return disentangled_attention_fwd(*args)[0]


def disentangled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           attention_mask: Optional[torch.Tensor] = None, *, pos_key: Optional[torch.Tensor] = None,
                           pos_query: Optional[torch.Tensor] = None, position_buckets: int = 256,
                           max_relative_positions: int = 512, dropout_p: float = 0.0, seed: Optional[int] = None,
                           scale: Optional[float] = None, want_probs: bool = False, backend: Optional[str] = None):
    """softmax((q k^T + c2p + p2c) / sqrt(head_dim * terms), padded keys masked) v.

    q, k, v: [batch, heads, seq, head_dim], one float dtype. attention_mask: [batch, seq], 1 = a
    real key, or None. pos_key, pos_query: [heads, 2 span, head_dim] (span: position_buckets where
    positive, else max_relative_positions), DeBERTa's relative embeddings through the key and the
    query projections, differentiable; None leaves that term out (config.pos_att_type). c2p[i, j] =
    q_i . pos_key[row(i - j)], p2c[i, j] = k_j . pos_query[row(i - j)]; each table may instead be
    only the rows [lo, hi) that seq reaches, [heads, hi - lo, head_dim] (lo, hi =
    position_index(seq, position_buckets, max_relative_positions)[1:]): what a model projects when
    it projects only those (the same result, fewer rows through its GEMMs). dropout_p on the
    probabilities (the keep-mask a function of `seed`, as fastbert.ops.attention's: counters from
    each row's first real key). scale: the scores' factor, by default 1 / sqrt(head_dim * terms)
    (transformers counts the terms config.pos_att_type names, even where relative_attention is
    off: the model passes its own). Returns the context [batch, heads, seq, head_dim] in q's dtype
    (zeros at padded queries on the fused backend), and with want_probs the probabilities too
    (the PyTorch formulation, on every backend)."""
    buckets, furthest, p = _check(q, k, v, 4, "[batch, heads, seq, head_dim]", position_buckets, max_relative_positions,
                                  dropout_p)
    backend = fb_backend.resolve(backend, q)
    mask = None
    if attention_mask is not None:
        mask = check_mask(OP, "attention_mask", attention_mask)
        if tuple(mask.shape) != (q.shape[0], q.shape[2]):
            raise ValueError(f"fastbert.ops.{OP}: attention_mask must be [batch, seq] = {(q.shape[0], q.shape[2])}, "
                             f"got {tuple(mask.shape)}")
        check_device(OP, "attention_mask", mask, q, like="q")
        mask = mask.contiguous()
    scale = _default_scale(scale, q.shape[-1], pos_key, pos_query)
    seed_t = op_seed(seed) if p > 0 else None
    index, pos_key, pos_query = _tables(q, q.shape[2], pos_key, pos_query, buckets, furthest)
    if want_probs or _formulation(backend, q, pos_key, pos_query):
        return _torch_padded(q, k, v, mask, pos_key, pos_query, index, scale, p, seed_t, want_probs)
    return _fused(q, k, v, mask, None, pos_key, pos_query, index, scale, p, seed_t, backend)


def varlen_disentangled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                                  max_seqlen: int, *, pos_key: Optional[torch.Tensor] = None,
                                  pos_query: Optional[torch.Tensor] = None, position_buckets: int = 256,
                                  max_relative_positions: int = 512, dropout_p: float = 0.0,
                                  seed: Optional[int] = None, scale: Optional[float] = None,
                                  backend: Optional[str] = None, validate: bool = True) -> torch.Tensor:
    """disentangled_attention over packed sequences: q, k, v [total_tokens, heads, head_dim],
    cu_seqlens int32 [batch + 1], max_seqlen >= every sequence's length (as
    fastbert.ops.varlen_attention takes them; validate as there; the tables cut to what max_seqlen
    reaches, if cut). A token's position is its index
    in its sequence; the dropout mask of sequence b is the one disentangled_attention draws for
    row b of a right-padded batch. Returns [total_tokens, heads, head_dim] in q's dtype."""
    buckets, furthest, p = _check(q, k, v, 3, "[total_tokens, heads, head_dim]", position_buckets,
                                  max_relative_positions, dropout_p)
    check_cu_seqlens(OP, cu_seqlens, max_seqlen, q, bounds=validate)
    backend = fb_backend.resolve(backend, q)
    scale = _default_scale(scale, q.shape[-1], pos_key, pos_query)
    seed_t = op_seed(seed) if p > 0 else None
    index, pos_key, pos_query = _tables(q, max_seqlen, pos_key, pos_query, buckets, furthest)
    if _formulation(backend, q, pos_key, pos_query):
        return _torch_varlen(q, k, v, cu_seqlens, max_seqlen, pos_key, pos_query, index, scale, p, seed_t)
    return _fused(q, k, v, None, cu_seqlens.contiguous(), pos_key, pos_query, index, scale, p, seed_t, backend)


# --------------------------------------------------------------------------------------------
# the PyTorch formulation


def _torch_padded(q, k, v, mask, pos_key, pos_query, index, scale, p, seed, want_probs):
    """fastbert.reference's formulation on the tables' reached rows (index: position_index's)."""
    seq = q.shape[2]
    n = (index.numel() + 1) // 2
    pos = torch.arange(seq)
    rows = index.to(torch.int64)[pos[:, None] - pos[None, :] + n - 1].to(q.device)
    keep = None
    if p > 0:
        starts = reference.mask_starts(mask) if mask is not None else None
        keep = torch_keep_mask(seed, q.shape[0], q.shape[1], seq, p, starts).to(q.device)
    ctx, probs = attention_at_rows(q, k, v, mask, pos_key, pos_query, rows, keep, p, scale, want_probs)
    ctx = ctx.to(q.dtype)
    return (ctx, probs) if want_probs else ctx


def _torch_varlen(q, k, v, cu_seqlens, max_seqlen, pos_key, pos_query, index, scale, p, seed):
    """The packed batch padded to max_seqlen, through the padded formulation, and packed again."""
    padded, mask, indices = heads_padded((q, k, v), cu_seqlens, max_seqlen)
    return heads_packed(_torch_padded(*padded, mask, pos_key, pos_query, index, scale, p, seed, False), indices)
