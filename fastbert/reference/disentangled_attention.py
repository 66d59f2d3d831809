"""DeBERTa's disentangled attention, spelled out as transformers' DisentangledSelfAttention computes
it: the content-to-content scores q k^T, plus content-to-position (c2p: each query against the
position keys of the distance to each key) and position-to-content (p2c: each key against the
position queries of that distance), over sqrt(head_dim * (1 + the number of position terms)); the
padding mask, softmax, dropout, the values."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from fastbert.layouts import deberta_position_rows


def position_rows_matrix(seq: int, position_buckets: int, max_relative_positions: int, device=None) -> torch.Tensor:
    """int64 [seq, seq]: the position-table row query i and key j read (layouts.deberta_position_rows)."""
    rows = deberta_position_rows(seq, position_buckets, max_relative_positions, device)
    pos = torch.arange(seq, device=device)
    return rows[pos[:, None] - pos[None, :] + seq - 1]


def disentangled_scores(q: torch.Tensor, k: torch.Tensor, pos_key: Optional[torch.Tensor],
                        pos_query: Optional[torch.Tensor], position_buckets: int,
                        max_relative_positions: int, scale: Optional[float] = None) -> torch.Tensor:
    """The scaled scores [batch, heads, seq, seq] before the mask: q, k [batch, heads, seq, d];
    pos_key, pos_query [heads, 2 span, d] (None: that term is absent); scale: by default
    1 / sqrt(d * the terms present)."""
    rows = position_rows_matrix(q.shape[-2], position_buckets, max_relative_positions, q.device)
    return scores_at_rows(q, k, pos_key, pos_query, rows, scale)


def scores_at_rows(q: torch.Tensor, k: torch.Tensor, pos_key: Optional[torch.Tensor], pos_query: Optional[torch.Tensor],
                   rows: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """disentangled_scores with the table row of each (query, key) given: rows int64 [seq, seq]."""
    seq, d = q.shape[-2], q.shape[-1]
    terms = 1 + (pos_key is not None) + (pos_query is not None)
    scores = q @ k.transpose(-1, -2)
    index = rows.expand(*q.shape[:2], seq, seq)
    if pos_key is not None:  # c2p[i, j] = q_i . pos_key[row(i, j)]
        scores = scores + torch.gather(q @ pos_key.transpose(-1, -2), -1, index)
    if pos_query is not None:  # p2c[i, j] = k_j . pos_query[row(i, j)] (row(j, i) mirrored: the same row)
        scores = scores + torch.gather(k @ pos_query.transpose(-1, -2), -1, index.transpose(-1, -2)).transpose(-1, -2)
    return scores * (1 / math.sqrt(d * terms) if scale is None else scale)


def disentangled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           attention_mask: Optional[torch.Tensor] = None, pos_key: Optional[torch.Tensor] = None,
                           pos_query: Optional[torch.Tensor] = None, *, position_buckets: int = 256,
                           max_relative_positions: int = 512, keep_mask: Optional[torch.Tensor] = None,
                           dropout_p: float = 0.0, scale: Optional[float] = None, want_probs: bool = False
                           ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(context [batch, heads, seq, d], the probabilities or None): attention_mask [batch, seq]
    (1: a real key); keep_mask [batch, heads, seq, seq] the probabilities dropout keeps (scaled by
    1 / (1 - dropout_p))."""
    rows = position_rows_matrix(q.shape[-2], position_buckets, max_relative_positions, q.device)
    return attention_at_rows(q, k, v, attention_mask, pos_key, pos_query, rows, keep_mask, dropout_p, scale,
                             want_probs)


def attention_at_rows(q, k, v, attention_mask, pos_key, pos_query, rows, keep_mask=None, dropout_p: float = 0.0,
                      scale: Optional[float] = None, want_probs: bool = False):
    """disentangled_attention with the table row of each (query, key) given: rows int64 [seq, seq]
    (the tables may then hold only the rows that `rows` reads)."""
    scores = scores_at_rows(q, k, pos_key, pos_query, rows, scale).float()
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask.bool()[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    kept = probs if keep_mask is None else probs * keep_mask / (1 - dropout_p)
    return (kept.to(v.dtype) @ v), (probs.to(q.dtype) if want_probs else None)
