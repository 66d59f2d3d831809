"""The layouts, ranges and tables that the kernels, the ops, the models and the reference layers all
read the same way, kept apart from the reference (which holds only the ground truth):

- int8 weights: the ranges a quantized model's weights may take (WEIGHT_RANGES), their per-channel
  quantization, and the packed layout fastbert's packed int8 GEMM reads (PANEL, pack_weight,
  unpack_weight; csrc/kernels/int8_gemm_packed.cpp);
- relative position bias (MPNet's, T5's bidirectional): the bucket of each distance, the bias of
  each head by distance from a bucket table, and that bias spread over (query, key);
- DeBERTa's disentangled attention: the row of its position tables each distance reads.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

Tensor = torch.Tensor


WEIGHT_RANGES = (127, 64)  # the first is the default


def quantize_weight(w: Tensor, qmax: int = 127) -> Tuple[Tensor, Tensor]:
    """w [out, in] float -> (q int8 [out, in], scale float32 [out]), per output channel, symmetric,
    q in [-qmax, qmax]: 127, or 64."""
    v = w.float()
    amax = v.abs().amax(dim=-1)
    inv = torch.where(amax > 0, torch.full_like(amax, float(qmax)) / amax, torch.zeros_like(amax))
    return torch.round(v * inv[:, None]).clamp_(-qmax, qmax).to(torch.int8), amax / float(qmax)


PANEL = 16  # output features of a panel of a packed int8 weight


def pack_weight(q: Tensor) -> Tensor:
    """An int8 weight [out, in] (out a multiple of PANEL) in the layout fastbert's packed int8 GEMM
    reads (csrc/kernels/int8_gemm_packed.cpp): [out / 16, ceil(in / 4), 16, 4], panels of 16 output
    features, in each one 64-byte vector per 4 input features (zero past `in`)."""
    out, k = q.shape
    kq = (k + 3) // 4
    padded = torch.nn.functional.pad(q, (0, 4 * kq - k)) if 4 * kq != k else q
    return padded.reshape(out // PANEL, PANEL, kq, 4).permute(0, 2, 1, 3).contiguous()


def unpack_weight(packed: Tensor, in_features: int) -> Tensor:
    """pack_weight's inverse: the int8 weight [out, in_features]."""
    panels, kq = packed.shape[0], packed.shape[1]
    return packed.permute(0, 2, 1, 3).reshape(panels * PANEL, 4 * kq)[:, :in_features].contiguous()


def relative_position_buckets(n: int, num_buckets: int = 32, max_distance: int = 128, device=None) -> torch.Tensor:
    """int64 [2n - 1]: MPNet's (and T5's bidirectional) bucket of each relative position j - i, for
    j - i = -(n - 1) .. n - 1 (entry j - i + n - 1), as transformers' MPNet computes it: half the
    buckets per direction, the first half of those exact distances, the rest log-spaced up to
    max_distance."""
    n_ = -torch.arange(-(n - 1), n, dtype=torch.long, device=device)  # -(j - i)
    half = num_buckets // 2
    ret = (n_ < 0).to(torch.long) * half
    n_ = n_.abs()
    max_exact = half // 2
    large = max_exact + (torch.log(n_.float() / max_exact) / math.log(max_distance / max_exact)
                         * (half - max_exact)).to(torch.long)
    large = torch.clamp(large, max=half - 1)
    return ret + torch.where(n_ < max_exact, n_, large)


def relative_bias(table: torch.Tensor, n: int, num_buckets: Optional[int] = None, max_distance: int = 128) -> torch.Tensor:
    """[heads, 2n - 1]: the bias of each head at each relative position j - i (entry j - i + n - 1),
    from MPNet's bucket table [num_buckets, heads] (its relative_attention_bias.weight); differentiable
    in the table. This is what attention(..., relative_bias=...) takes."""
    buckets = relative_position_buckets(n, num_buckets or table.shape[0], max_distance, table.device)
    return table.index_select(0, buckets).t().contiguous()


def relative_bias_matrix(rel: torch.Tensor, seq: int) -> torch.Tensor:
    """[heads, seq, seq]: rel [heads, 2n - 1] (n >= seq) spread over (query i, key j) as rel[:, j - i + n - 1]."""
    n = (rel.shape[-1] + 1) // 2
    pos = torch.arange(seq, device=rel.device)
    return rel[:, pos[None, :] - pos[:, None] + n - 1]


def deberta_span(position_buckets: int, max_relative_positions: int) -> int:
    """Half the rows of DeBERTa's relative embeddings, its attention span: position_buckets where
    positive, else max_relative_positions."""
    return position_buckets if position_buckets > 0 else max_relative_positions


def deberta_position_rows(seq: int, position_buckets: int, max_relative_positions: int, device=None) -> torch.Tensor:
    """int64 [2 seq - 1]: for each distance d = i - j between query i and key j (at index d + seq - 1),
    the row of DeBERTa's position tables both of its terms read, clamp(bucket(d) + span, 0, 2 span - 1):
    d itself within position_buckets / 2 of 0, log-spaced buckets beyond, up to max_relative_positions
    (transformers' make_log_bucket_position, computed the same way, in float32); no buckets where
    position_buckets <= 0. The row depends on i - j alone, so left padding and packed rows read the
    same rows as the padded row does."""
    rel = torch.arange(-(seq - 1), seq, dtype=torch.int64, device=device)
    span = deberta_span(position_buckets, max_relative_positions)
    if position_buckets > 0 and max_relative_positions > 0:
        mid = position_buckets // 2
        sign = torch.sign(rel)
        abs_pos = torch.where((rel < mid) & (rel > -mid), torch.tensor(mid - 1, device=device), rel.abs())
        log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_relative_positions - 1) / mid))
                             * (mid - 1)) + mid
        rel = torch.where(abs_pos <= mid, rel.to(log_pos.dtype), log_pos * sign).to(torch.int64)
    return (rel + span).clamp(0, 2 * span - 1)
