"""DeBERTa's disentangled attention (deberta-v2 / v3): content-to-content scores plus the
content-to-position and position-to-content terms, each read from a table [seq, 2 span] per head
(q against the position keys, k against the position queries) at the row of the bucketed distance
(fastbert.layouts.deberta_position_rows), then the padding mask, softmax, dropout and the values.

The terms' tables are products of q and k with the position projections, [seq, 2 span] per head,
never [seq, seq]; the fused kernels that read them by distance inside the attention (as the MPNet
bias is read) are not written yet: every backend runs the formulation of
fastbert.reference.disentangled_attention, whose gathers are [seq, seq] (docs/models.md, DeBERTa).
"""
from __future__ import annotations

from typing import Optional

import torch

from fastbert import backend as fb_backend
from fastbert import reference
from fastbert.layouts import deberta_position_rows
from fastbert.ops.checks import check_float, check_int, check_mask, check_prob
from fastbert.ops.common import op_seed
from fastbert.reference.disentangled_attention import attention_at_rows, position_rows_matrix

OP = "disentangled_attention"


def disentangled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           attention_mask: Optional[torch.Tensor] = None, *, pos_key: Optional[torch.Tensor] = None,
                           pos_query: Optional[torch.Tensor] = None, position_buckets: int = 256,
                           max_relative_positions: int = 512, dropout_p: float = 0.0, seed: Optional[int] = None,
                           scale: Optional[float] = None, want_probs: bool = False, backend: Optional[str] = None):
    """softmax((q k^T + c2p + p2c) / sqrt(head_dim * terms), padded keys masked) v.

    q, k, v: [batch, heads, seq, head_dim], one float dtype. attention_mask: [batch, seq], 1 = a
    real key, or None. pos_key, pos_query: [heads, 2 span, head_dim] (span: position_buckets where
    positive, else max_relative_positions), DeBERTa's relative embeddings through the key and the
    query projections; None leaves that term out (config.pos_att_type). c2p[i, j] = q_i .
    pos_key[row(i - j)], p2c[i, j] = k_j . pos_query[row(i - j)]. dropout_p on the probabilities
    (the keep-mask a function of `seed`, as fastbert.ops.attention's). scale: the scores' factor, by
    default 1 / sqrt(head_dim * terms) (transformers counts the terms config.pos_att_type names, even
    where relative_attention is off: the model passes its own). Returns the context
    [batch, heads, seq, head_dim] in q's dtype, and with want_probs the probabilities too.
    backend: checked as every op's; the PyTorch formulation runs on each (see the module docstring)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(OP, name, t)
        if t.dim() != 4 or t.shape != q.shape:
            raise ValueError(f"fastbert.ops.{OP}: q, k and v must be [batch, heads, seq, head_dim] of one shape, "
                             f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    fb_backend.resolve(backend, q)
    buckets = check_int(OP, "position_buckets", position_buckets, -(1 << 30))
    furthest = check_int(OP, "max_relative_positions", max_relative_positions, 1)
    span = buckets if buckets > 0 else furthest
    heads, d = q.shape[1], q.shape[3]
    for name, t in (("pos_key", pos_key), ("pos_query", pos_query)):
        if t is None:
            continue
        check_float(OP, name, t)
        if tuple(t.shape) != (heads, 2 * span, d):
            raise ValueError(f"fastbert.ops.{OP}: {name} must be [heads, 2 span, head_dim] = {(heads, 2 * span, d)}, "
                             f"got {tuple(t.shape)}")
    mask = None
    if attention_mask is not None:
        mask = check_mask(OP, "attention_mask", attention_mask)
        if tuple(mask.shape) != (q.shape[0], q.shape[2]):
            raise ValueError(f"fastbert.ops.{OP}: attention_mask must be [batch, seq] = {(q.shape[0], q.shape[2])}, "
                             f"got {tuple(mask.shape)}")
    p = check_prob(OP, "dropout_p", dropout_p)
    keep = None
    if p > 0:
        b, h, s = q.shape[:3]
        keep = reference.attention_keep_mask(op_seed(seed), b, h, s, s, p, device=q.device)
    # the tables' rows this length reaches, and no others: 2 seq - 1 of the 2 span where seq is short
    reached = deberta_position_rows(q.shape[2], buckets, furthest)
    lo, hi = int(reached.min()), int(reached.max()) + 1
    rows = position_rows_matrix(q.shape[2], buckets, furthest).to(q.device) - lo
    if scale is None:
        scale = (d * (1 + (pos_key is not None) + (pos_query is not None))) ** -0.5
    ctx, probs = attention_at_rows(
        q, k, v, mask, None if pos_key is None else pos_key[:, lo:hi], None if pos_query is None else pos_query[:, lo:hi],
        rows, keep, p, scale, want_probs)
    ctx = ctx.to(q.dtype)
    return (ctx, probs) if want_probs else ctx
