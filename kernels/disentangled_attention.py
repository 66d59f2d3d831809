"""DeBERTa's disentangled attention on the GPU (the "triton" backend of
fastbert.ops.disentangled_attention): its three kernels (forward, dq, dk / dv), their launchers
`disentangled_attention_forward` / `disentangled_attention_backward` (the C++ extension's
signature: padded with a key mask, or packed with cu_seqlens), their launch settings and the build
report's list of their variants. The jit helpers of the padding, the dropout and the tiles' loads
are fastbert.kernels.attention's, and so is the preprocessing kernel of the backward.

    s[i, j] = q_i . k_j + q_i . pk[idx(i - j)] + k_j . pq[idx(i - j)],  out = softmax(s * scale) v

pk, pq: one head's position tables [R, D] (the rows the op's lengths reach), idx: int32
[2n - 1], the table row of each distance i - j at i - j + n - 1 (fastbert.ops.disentangled_attention
.position_index). Positions are those of fastbert.kernels.attention: padded rows (padding included)
or the index within a packed sequence, so the rows read depend on i - j alone.

A tile of BLOCK_M queries against BLOCK_N keys meets the T = BLOCK_M + BLOCK_N - 1 distances
start_m - start_n - (BLOCK_N - 1) + t, t in [0, T) (T rounded up to a power of 2). The kernels load
the table rows of those distances, pk[idx(d_t)] as a [T, D] tile, and make A = q . pk_d^T [M, T]
and B = pq_d . k^T [T, N]; the pair (m, n) reads column (row) u = m - n + BLOCK_N - 1 of them, one
tl.gather each: the terms cost two products of the tile's size twice over and never exist beyond
the tile. The backward's score gradients go back the same way: skewed so that a column is one
distance (zc[m, t] = ds[m, m - t + BLOCK_N - 1], zp[n, t] = ds[t + n - BLOCK_N + 1, n]), dq gets
zc . pk_d and dk zp . pq_d, and the tables' gradients zc^T . q and zp^T . k are added atomically
into fp32 [H, R, D] (rows of one tile may repeat, log buckets; fp32 atomics, so their last bits
vary from run to run, as the relative bias's gradient does). Scores are in the log2 domain
(scale * log2(e)), the softmax online, the padding and dropout as fastbert.kernels.attention's
(the same jit helpers, the same Philox counters), a query with no real key gives zeros and
lse = +inf. The backward is two kernels, dq over key tiles and dk / dv over query tiles, with
delta = rowsum(dO * O) from the attention's preprocessing kernel: no atomics but the tables'.
"""
from __future__ import annotations

from typing import Dict, Iterator, Optional, Tuple

import torch
import triton
import triton.language as tl

from . import KernelBuild, Settings, cdiv, dropout_options, launch
from .attention.args import LOG2E, optional_tensor
from .attention.common import dropout_keep, load_tile, load_vec, mask_scores, sequence_span, store_tile
from .attention.launchers import delta_launch, key_mask_ranges
from .attention.settings import HEAD_DIMS, block_d, dot_precision
from .attention.variants import kernel_build

__all__ = ["disentangled_attention_forward", "disentangled_attention_backward", "disentangled_takes",
           "disentangled_settings", "report_configs"]

# --------------------------------------------------------------------------------------------
# jit helpers


@triton.jit
def _distance_rows(IDX, start_m, start_n, pos_n, BLOCK_N: tl.constexpr, T: tl.constexpr):
    # int32 [T]: the table row of each distance the tile meets, d_t = start_m - start_n - (BLOCK_N - 1)
    # + t, clamped to the index (only rows or keys past the sequence reach past it)
    d = start_m - start_n - (BLOCK_N - 1) + tl.arange(0, T)
    d = tl.minimum(tl.maximum(d, 1 - pos_n), pos_n - 1)
    return tl.load(IDX + d + pos_n - 1)


@triton.jit
def _table_rows(P, r, offs_d, head_dim, ON: tl.constexpr):
    # [T, BLOCK_D] rows r of one head's table (rows of head_dim elements), zeros past head_dim
    if ON:
        return tl.load(P + r.to(tl.int64)[:, None] * head_dim + offs_d[None, :], mask=(offs_d < head_dim)[None, :],
                       other=0.)
    else:
        return tl.zeros([r.shape[0], offs_d.shape[0]], P.dtype.element_ty)


@triton.jit
def _scores(q, k, pk, pq, u, C2P: tl.constexpr, P2C: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # [M, N] unscaled scores of the tile: q k^T and the terms (u[m, n] = m - n + BLOCK_N - 1)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if C2P:
        s += tl.gather(tl.dot(q, tl.trans(pk), input_precision=DOT_PRECISION), u, 1)
    if P2C:
        s += tl.gather(tl.dot(pq, tl.trans(k), input_precision=DOT_PRECISION), u, 0)
    return s


@triton.jit
def _probabilities(s, qk_scale, lse, MASK, rows, cols, lo, hi, seed, bh, threshold, drop_scale,
                   HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    # (p, p with dropout applied and scaled, keep) of a tile's unscaled scores, from the saved lse
    s = mask_scores(s * qk_scale, MASK, cols, hi, HAS_MASK, True)
    p = tl.math.exp2(s - lse[:, None])
    if HAS_DROPOUT:
        keep = dropout_keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold)
        return p, tl.where(keep, p * drop_scale, 0.), keep
    else:
        return p, p, p > 0.


@triton.jit
def _score_grads(p, dp, keep, delta, sm_scale, drop_scale, HAS_DROPOUT: tl.constexpr):
    # the gradient of the unscaled scores: p (dp' - delta) scale, dp' = dp with dropout's mask and scale
    if HAS_DROPOUT:
        dp = tl.where(keep, dp * drop_scale, 0.)
    return p * (dp - delta[:, None]) * sm_scale


@triton.jit
def _skew(ds, idx, width):
    # z[a, t] = ds[a, idx[a, t]] where 0 <= idx < width, else 0
    inside = (idx >= 0) & (idx < width)
    return tl.where(inside, tl.gather(ds, tl.minimum(tl.maximum(idx, 0), width - 1), 1), 0.)


@triton.jit
def _add_rows(DP, r, grad, offs_t, offs_d, head_dim, n_dist):
    # DP[r[t]] += grad[t] for the tile's distances t < n_dist (fp32 atomics: rows may repeat)
    tl.atomic_add(DP + r.to(tl.int64)[:, None] * head_dim + offs_d[None, :], grad,
                  mask=(offs_t < n_dist)[:, None] & (offs_d < head_dim)[None, :], sem="relaxed")


# --------------------------------------------------------------------------------------------
# kernels

_NO_SPECIALIZE = ["stride_lb", "stride_lh", "MASK", "stride_mb", "RANGES", "CU_SEQLENS", "DPK", "DPQ", "pos_n",
                  "heads", "seq", "seed", "threshold"]


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def disentangled_fwd_kernel(
    OUT, stride_ob, stride_oh, stride_os,  # [B, H, S, D] out (varlen: [T, H, D]), q.dtype
    LSE, stride_lb, stride_lh,  # [B, H, S] out (varlen: [H, T]), fp32: log2-sum-exp2 of the scaled scores
    Q, stride_qb, stride_qh, stride_qs,  # [B, H, S, D] (varlen: [T, H, D]; stride_qb = stride_qs)
    K, stride_kb, stride_kh, stride_ks,
    V, stride_vb, stride_vh, stride_vs,
    MASK, stride_mb,  # [B, S] bool key mask (HAS_MASK)
    RANGES,  # [B, 2] int32 real range of each row of MASK (HAS_MASK)
    CU_SEQLENS,  # [B + 1] int32 (VARLEN)
    PK, PQ, stride_ph,  # [H, R, D] q.dtype position tables (C2P / P2C), head stride R * D
    IDX, pos_n,  # [2n - 1] int32: the row of distance i - j at i - j + n - 1
    heads, seq, head_dim,
    qk_scale,  # scale * log2(e)
    seed: tl.int64, threshold, drop_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, T: tl.constexpr,
    HAS_MASK: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr, C2P: tl.constexpr, P2C: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = sequence_span(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
    h64 = h.to(tl.int64)
    Q += off * stride_qb + h64 * stride_qh
    K += off * stride_kb + h64 * stride_kh
    V += off * stride_vb + h64 * stride_vh
    OUT += off * stride_ob + h64 * stride_oh
    LSE += off * stride_lb + h64 * stride_lh
    PK += h64 * stride_ph
    PQ += h64 * stride_ph
    if HAS_MASK:
        MASK += b.to(tl.int64) * stride_mb
    bh = b * heads + h
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    u = tl.arange(0, BLOCK_M)[:, None] - offs_n[None, :] + (BLOCK_N - 1)
    active = (start_m < hi) & (start_m + BLOCK_M > lo)
    q = load_tile(Q + rows[:, None] * stride_qs + offs_d[None, :], rows, tl.where(active, hi, 0), offs_d, head_dim,
                  True)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # the first key tile starts at lo, a real key of every row: m_i is finite from then on
    for start_n in range(lo, tl.where(active, hi, lo), BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(K + cols[:, None] * stride_ks + offs_d[None, :], cols, hi, offs_d, head_dim, True)
        r = _distance_rows(IDX, start_m, start_n, pos_n, BLOCK_N, T)
        pk = _table_rows(PK, r, offs_d, head_dim, C2P)
        pq = _table_rows(PQ, r, offs_d, head_dim, P2C)
        s = _scores(q, k, pk, pq, u, C2P, P2C, DOT_PRECISION)
        s = mask_scores(s * qk_scale, MASK, cols, hi, HAS_MASK, True)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            p = tl.where(dropout_keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold), p, 0.)
        v = load_tile(V + cols[:, None] * stride_vs + offs_d[None, :], cols, hi, offs_d, head_dim, True)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    real_row = (rows >= lo) & (rows < hi)
    if HAS_MASK:
        real_row = real_row & (tl.load(MASK + rows, mask=real_row, other=0) != 0)
    l_safe = tl.where(real_row, l_i, 1.)
    if HAS_DROPOUT:
        acc = acc * drop_scale
    out = tl.where(real_row[:, None], acc / l_safe[:, None], 0.)
    lse = tl.where(real_row, m_i + tl.math.log2(l_safe), float("inf"))
    row_limit = hi if VARLEN else seq
    store_tile(OUT + rows[:, None] * stride_os + offs_d[None, :], out, rows, row_limit, offs_d, head_dim, True)
    tl.store(LSE + rows, lse, mask=rows < row_limit)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def disentangled_bwd_dq_kernel(
    DQ, stride_gb, stride_gh, stride_gs,  # [B, H, S, D] out (varlen: [T, H, D]), q.dtype
    DPK,  # [H, R, D] fp32, the position keys' gradient, accumulated (C2P)
    Q, stride_qb, stride_qh, stride_qs,
    K, stride_kb, stride_kh, stride_ks,
    V, stride_vb, stride_vh, stride_vs,
    DO, stride_dob, stride_doh, stride_dos,
    LSE, DELTA, stride_lb, stride_lh,  # fp32, the forward's lse and rowsum(dO * O), one layout
    MASK, stride_mb, RANGES, CU_SEQLENS,
    PK, PQ, stride_ph, IDX, pos_n,
    heads, seq, head_dim, qk_scale, sm_scale,
    seed: tl.int64, threshold, drop_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, T: tl.constexpr,
    HAS_MASK: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr, C2P: tl.constexpr, P2C: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = sequence_span(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
    h64 = h.to(tl.int64)
    Q += off * stride_qb + h64 * stride_qh
    K += off * stride_kb + h64 * stride_kh
    V += off * stride_vb + h64 * stride_vh
    DO += off * stride_dob + h64 * stride_doh
    DQ += off * stride_gb + h64 * stride_gh
    LSE += off * stride_lb + h64 * stride_lh
    DELTA += off * stride_lb + h64 * stride_lh
    PK += h64 * stride_ph
    PQ += h64 * stride_ph
    DPK += h64 * stride_ph
    if HAS_MASK:
        MASK += b.to(tl.int64) * stride_mb
    bh = b * heads + h
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, T)
    u = tl.arange(0, BLOCK_M)[:, None] - offs_n[None, :] + (BLOCK_N - 1)
    key_of = tl.arange(0, BLOCK_M)[:, None] - offs_t[None, :] + (BLOCK_N - 1)  # [M, T]: the key of (m, distance t)
    active = (start_m < hi) & (start_m + BLOCK_M > lo)
    limit = tl.where(active, hi, 0)
    q = load_tile(Q + rows[:, None] * stride_qs + offs_d[None, :], rows, limit, offs_d, head_dim, True)
    do = load_tile(DO + rows[:, None] * stride_dos + offs_d[None, :], rows, limit, offs_d, head_dim, True)
    lse = load_vec(LSE + rows, rows, limit, float("inf"), True)
    delta = load_vec(DELTA + rows, rows, limit, 0., True)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, tl.where(active, hi, lo), BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(K + cols[:, None] * stride_ks + offs_d[None, :], cols, hi, offs_d, head_dim, True)
        v = load_tile(V + cols[:, None] * stride_vs + offs_d[None, :], cols, hi, offs_d, head_dim, True)
        r = _distance_rows(IDX, start_m, start_n, pos_n, BLOCK_N, T)
        pk = _table_rows(PK, r, offs_d, head_dim, C2P)
        pq = _table_rows(PQ, r, offs_d, head_dim, P2C)
        s = _scores(q, k, pk, pq, u, C2P, P2C, DOT_PRECISION)
        p, _, keep = _probabilities(s, qk_scale, lse, MASK, rows, cols, lo, hi, seed, bh, threshold, drop_scale,
                                    HAS_MASK, HAS_DROPOUT)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = _score_grads(p, dp, keep, delta, sm_scale, drop_scale, HAS_DROPOUT)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
        if C2P:  # dq += zc pk_d, dpk[r] += zc^T q
            zc = _skew(ds, key_of, BLOCK_N)
            dq = tl.dot(zc.to(pk.dtype), pk, dq, input_precision=DOT_PRECISION)
            _add_rows(DPK, r, tl.dot(tl.trans(zc.to(q.dtype)), q, input_precision=DOT_PRECISION), offs_t, offs_d,
                      head_dim, BLOCK_M + BLOCK_N - 1)
    row_limit = hi if VARLEN else seq
    store_tile(DQ + rows[:, None] * stride_gs + offs_d[None, :], dq, rows, row_limit, offs_d, head_dim, True)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def disentangled_bwd_dkdv_kernel(
    DK, DV, stride_gb, stride_gh, stride_gs,  # [B, H, S, D] out (varlen: [T, H, D]), q.dtype, one layout
    DPQ,  # [H, R, D] fp32, the position queries' gradient, accumulated (P2C)
    Q, stride_qb, stride_qh, stride_qs,
    K, stride_kb, stride_kh, stride_ks,
    V, stride_vb, stride_vh, stride_vs,
    DO, stride_dob, stride_doh, stride_dos,
    LSE, DELTA, stride_lb, stride_lh,
    MASK, stride_mb, RANGES, CU_SEQLENS,
    PK, PQ, stride_ph, IDX, pos_n,
    heads, seq, head_dim, qk_scale, sm_scale,
    seed: tl.int64, threshold, drop_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, T: tl.constexpr,
    HAS_MASK: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr, C2P: tl.constexpr, P2C: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = sequence_span(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
    h64 = h.to(tl.int64)
    Q += off * stride_qb + h64 * stride_qh
    K += off * stride_kb + h64 * stride_kh
    V += off * stride_vb + h64 * stride_vh
    DO += off * stride_dob + h64 * stride_doh
    DK += off * stride_gb + h64 * stride_gh
    DV += off * stride_gb + h64 * stride_gh
    LSE += off * stride_lb + h64 * stride_lh
    DELTA += off * stride_lb + h64 * stride_lh
    PK += h64 * stride_ph
    PQ += h64 * stride_ph
    DPQ += h64 * stride_ph
    if HAS_MASK:
        MASK += b.to(tl.int64) * stride_mb
    bh = b * heads + h
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, T)
    u = offs_m[:, None] - tl.arange(0, BLOCK_N)[None, :] + (BLOCK_N - 1)
    query_of = offs_t[None, :] + tl.arange(0, BLOCK_N)[:, None] - (BLOCK_N - 1)  # [N, T]: the query of (n, distance t)
    active = (start_n < hi) & (start_n + BLOCK_N > lo)
    limit = tl.where(active, hi, 0)
    k = load_tile(K + cols[:, None] * stride_ks + offs_d[None, :], cols, limit, offs_d, head_dim, True)
    v = load_tile(V + cols[:, None] * stride_vs + offs_d[None, :], cols, limit, offs_d, head_dim, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start_m in range(lo, tl.where(active, hi, lo), BLOCK_M):
        rows = start_m + offs_m
        q = load_tile(Q + rows[:, None] * stride_qs + offs_d[None, :], rows, hi, offs_d, head_dim, True)
        do = load_tile(DO + rows[:, None] * stride_dos + offs_d[None, :], rows, hi, offs_d, head_dim, True)
        lse = load_vec(LSE + rows, rows, hi, float("inf"), True)
        delta = load_vec(DELTA + rows, rows, hi, 0., True)
        r = _distance_rows(IDX, start_m, start_n, pos_n, BLOCK_N, T)
        pk = _table_rows(PK, r, offs_d, head_dim, C2P)
        pq = _table_rows(PQ, r, offs_d, head_dim, P2C)
        s = _scores(q, k, pk, pq, u, C2P, P2C, DOT_PRECISION)
        p, p_kept, keep = _probabilities(s, qk_scale, lse, MASK, rows, cols, lo, hi, seed, bh, threshold, drop_scale,
                                         HAS_MASK, HAS_DROPOUT)
        dv = tl.dot(tl.trans(p_kept.to(do.dtype)), do, dv, input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds_t = tl.trans(_score_grads(p, dp, keep, delta, sm_scale, drop_scale, HAS_DROPOUT))  # [N, M]
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
        if P2C:  # dk += zp pq_d, dpq[r] += zp^T k
            zp = _skew(ds_t, query_of, BLOCK_M)
            dk = tl.dot(zp.to(pq.dtype), pq, dk, input_precision=DOT_PRECISION)
            _add_rows(DPQ, r, tl.dot(tl.trans(zp.to(k.dtype)), k, input_precision=DOT_PRECISION), offs_t, offs_d,
                      head_dim, BLOCK_M + BLOCK_N - 1)
    row_limit = hi if VARLEN else seq
    store_tile(DK + cols[:, None] * stride_gs + offs_d[None, :], dk, cols, row_limit, offs_d, head_dim, True)
    store_tile(DV + cols[:, None] * stride_gs + offs_d[None, :], dv, cols, row_limit, offs_d, head_dim, True)


# --------------------------------------------------------------------------------------------
# settings

KERNELS = ("fwd", "bwd_dq", "bwd_dkdv")
TAKES_DTYPES = (torch.float16, torch.bfloat16)
TAKES_BLOCK_DS = (32, 64)  # head dims up to 64: every DeBERTa-v2 / v3 checkpoint's (64)
# (kernel, BLOCK_D) -> settings of the 16-bit kernels: square tiles (T = 2 x the tile), whose
# distance products [M, T] and [T, N] and the table rows [T, D] hold more registers than the
# scores. Chosen to compile with no spills on sm_80 and sm_90 (python -m fastbert.kernels.report
# --kernels disentangled), not timed. fp32 (tf32x3 holds each operand twice) and head dims past 64
# spilled at every tile tried down to 16 x 16 with 8 warps: those calls run the op's PyTorch formulation.
_TABLE: Dict[Tuple[str, int], Settings] = {
    ("fwd", 32): Settings(32, 32, 8, 2, None),
    ("fwd", 64): Settings(32, 32, 8, 2, None),
    ("bwd_dq", 32): Settings(32, 32, 8, 1, None),
    ("bwd_dq", 64): Settings(16, 16, 8, 1, None),
    ("bwd_dkdv", 32): Settings(32, 32, 8, 1, None),
    ("bwd_dkdv", 64): Settings(16, 16, 8, 1, None),
}


def disentangled_takes(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernels take q of this dtype and head_dim (16-bit, a head dim of HEAD_DIMS up to 64)."""
    return dtype in TAKES_DTYPES and head_dim in HEAD_DIMS and block_d(head_dim) in TAKES_BLOCK_DS


def disentangled_settings(head_dim: int, dtype: torch.dtype, kernel: str) -> Settings:
    """Tile shape and launch options of `kernel` (one of KERNELS) for q's dtype and head_dim."""
    if not disentangled_takes(dtype, head_dim):
        raise ValueError(f"fastbert: the Triton disentangled attention takes float16 / bfloat16 and head_dim in "
                         f"{tuple(d for d in HEAD_DIMS if block_d(d) in TAKES_BLOCK_DS)}, got {dtype}, {head_dim}")
    return _TABLE[(kernel, block_d(head_dim))]


def _distances(s: Settings) -> int:
    # T: the distances a tile meets, rounded up to a power of 2
    return triton.next_power_of_2(s.block_m + s.block_n - 1)


# --------------------------------------------------------------------------------------------
# launchers


def _layout(q: torch.Tensor, key_mask, cu_seqlens, pos_index):
    """(packed, batch, heads, seq, lse shape, lse strides (a sequence's offset, a head's)) of a call:
    packed [T, H, D] with cu_seqlens (seq: the n of pos_index, at least the longest sequence: no read
    of cu_seqlens on the host), else padded [B, H, S, D]."""
    if cu_seqlens is not None:
        batch, heads, tokens = cu_seqlens.shape[0] - 1, q.shape[1], q.shape[0]
        return True, batch, heads, (pos_index.numel() + 1) // 2, (heads, tokens), (1, tokens)
    batch, heads, seq = q.shape[:3]
    return False, batch, heads, seq, (batch, heads, seq), (heads * seq, seq)


def _mask_args(packed: bool, key_mask, batch: int, seq: int, device) -> tuple:
    """MASK, stride_mb, RANGES of the kernels: padded, the key mask (all real when None) and each
    row's real range, found on the device (fastbert.kernels.attention's); packed, absent."""
    mask, ranges = (None, None) if packed else key_mask_ranges(key_mask, batch, seq, device, False)
    return (optional_tensor(mask, torch.bool, device), mask.stride(0) if mask is not None else 0,
            optional_tensor(ranges, torch.int32, device))


def _rows(t: torch.Tensor) -> torch.Tensor:
    # the kernels read rows with a contiguous last dim
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t: torch.Tensor, packed: bool) -> Tuple[int, int, int]:
    # (sequence or batch, head, row) strides: packed rows are found by token offset
    if packed:
        return t.stride(0), t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


def _tables(pos_key, pos_query, q, pos_index):
    """(pk, pq, head stride, index, pos_n, C2P, P2C): the tables as the kernels read them (q's dtype,
    contiguous [H, R, D]; a table left out is the other's stand-in, never read) and the index on q's device."""
    pk = (pos_key if pos_key is not None else pos_query).to(q.dtype).contiguous()
    pq = (pos_query if pos_query is not None else pos_key).to(q.dtype).contiguous()
    index = pos_index.to(device=q.device, dtype=torch.int32)
    return pk, pq, pk.shape[1] * pk.shape[2], index, (index.numel() + 1) // 2, pos_key is not None, pos_query is not None


def disentangled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor],
                                   cu_seqlens: Optional[torch.Tensor], pos_key: Optional[torch.Tensor],
                                   pos_query: Optional[torch.Tensor], pos_index: torch.Tensor, scale: float,
                                   dropout_p: float, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the disentangled attention (the arguments as the C++ extension's
    disentangled_attention_forward takes them; q, k, v with a contiguous last dim, head_dim in
    HEAD_DIMS). out: q's shape, contiguous, zeros at padded queries; lse: fp32 [B, H, S] padded,
    [H, T] packed."""
    head_dim = q.shape[-1]
    q, k, v = (_rows(t) for t in (q, k, v))
    packed, batch, heads, seq, lse_shape, lse_st = _layout(q, key_mask, cu_seqlens, pos_index)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return out, lse.fill_(float("inf"))
    drop = dropout_options(dropout_p, seed, "disentangled_attention")
    pk, pq, stride_ph, index, pos_n, c2p, p2c = _tables(pos_key, pos_query, q, pos_index)
    s = disentangled_settings(head_dim, q.dtype, "fwd")
    launch(disentangled_fwd_kernel, (cdiv(seq, s.block_m), heads, batch),
           (out, *_strides(out, packed), lse, *lse_st,
            q, *_strides(q, packed), k, *_strides(k, packed), v, *_strides(v, packed),
            *_mask_args(packed, key_mask, batch, seq, q.device), optional_tensor(cu_seqlens, torch.int32, q.device),
            pk, pq, stride_ph, index, pos_n, heads, seq, head_dim, scale * LOG2E,
            drop.seed, drop.threshold, drop.scale),
           dict(BLOCK_M=s.block_m, BLOCK_N=s.block_n, BLOCK_D=block_d(head_dim), T=_distances(s), HAS_MASK=not packed,
                VARLEN=packed, HAS_DROPOUT=drop.on, C2P=c2p, P2C=p2c, DOT_PRECISION=dot_precision(q.dtype),
                **s.options()))
    return out, lse


def disentangled_attention_backward(do, q, k, v, out, lse, key_mask, cu_seqlens, pos_key, pos_query, pos_index,
                                    scale: float, dropout_p: float, seed: int):
    """(dq, dk, dv, dpos_key, dpos_query) of disentangled_attention_forward: dq, dk, dv contiguous
    in q's dtype (zeros at padded positions); each table's gradient in its dtype, or an empty fp32
    tensor where the table is None."""
    head_dim = q.shape[-1]
    do, q, k, v, out = (_rows(t) for t in (do, q, k, v, out))
    packed, batch, heads, seq, lse_shape, lse_st = _layout(q, key_mask, cu_seqlens, pos_index)
    # every row of dq, dk, dv is written (zeros outside the sequences)
    dq, dk, dv = (torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    pk, pq, stride_ph, index, pos_n, c2p, p2c = _tables(pos_key, pos_query, q, pos_index)
    dpk = torch.zeros(pk.shape, dtype=torch.float32, device=q.device) if c2p else None
    dpq = torch.zeros(pq.shape, dtype=torch.float32, device=q.device) if p2c else None

    def result():
        def grad(g, t):
            return g.to(t.dtype) if g is not None else torch.empty(0, dtype=torch.float32, device=q.device)
        return dq, dk, dv, grad(dpk, pos_key), grad(dpq, pos_query)

    if q.numel() == 0:
        return result()
    drop = dropout_options(dropout_p, seed, "disentangled_attention")
    delta = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    do_st = _strides(do, packed)
    kernel, grid, args, options = delta_launch(out, do, delta, lse_st, _strides(out, packed), do_st, packed, batch, seq,
                                               heads)
    launch(kernel, grid, args, options)
    common = (
        q, *_strides(q, packed), k, *_strides(k, packed), v, *_strides(v, packed), do, *do_st,
        lse, delta, *lse_st,
        *_mask_args(packed, key_mask, batch, seq, q.device), optional_tensor(cu_seqlens, torch.int32, q.device),
        pk, pq, stride_ph, index, pos_n, heads, seq, head_dim, scale * LOG2E, scale,
        drop.seed, drop.threshold, drop.scale,
    )
    flags = dict(BLOCK_D=block_d(head_dim), HAS_MASK=not packed, VARLEN=packed, HAS_DROPOUT=drop.on, C2P=c2p,
                 P2C=p2c, DOT_PRECISION=dot_precision(q.dtype))
    g_st = _strides(dq, packed)
    absent = optional_tensor(None, torch.float32, q.device)
    s = disentangled_settings(head_dim, q.dtype, "bwd_dq")
    launch(disentangled_bwd_dq_kernel, (cdiv(seq, s.block_m), heads, batch),
           (dq, *g_st, dpk if dpk is not None else absent, *common),
           dict(BLOCK_M=s.block_m, BLOCK_N=s.block_n, T=_distances(s), **flags, **s.options()))
    s = disentangled_settings(head_dim, q.dtype, "bwd_dkdv")
    launch(disentangled_bwd_dkdv_kernel, (cdiv(seq, s.block_n), heads, batch),
           (dk, dv, *g_st, dpq if dpq is not None else absent, *common),
           dict(BLOCK_M=s.block_m, BLOCK_N=s.block_n, T=_distances(s), **flags, **s.options()))
    return result()


# --------------------------------------------------------------------------------------------
# the build report's variants


def report_configs() -> Iterator[KernelBuild]:
    """Every (kernel, dtype, head dim block, layout, dropout, terms) the launchers can compile, as
    KernelBuild records (made as the attention kernels' are)."""
    for dt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for bd in TAKES_BLOCK_DS:
            dims = ",".join(str(d) for d in HEAD_DIMS if block_d(d) == bd)
            head_dim = next(d for d in HEAD_DIMS if block_d(d) == bd)
            for kernel, fn in (("fwd", disentangled_fwd_kernel), ("bwd_dq", disentangled_bwd_dq_kernel),
                               ("bwd_dkdv", disentangled_bwd_dkdv_kernel)):
                s = disentangled_settings(head_dim, dtype, kernel)
                for has_mask, varlen in ((True, False), (False, True)):
                    for dropout in (False, True):
                        for c2p, p2c in ((True, True), (True, False), (False, True)):
                            constexprs = {"BLOCK_M": s.block_m, "BLOCK_N": s.block_n, "BLOCK_D": bd,
                                          "T": _distances(s), "HAS_MASK": has_mask, "VARLEN": varlen,
                                          "HAS_DROPOUT": dropout, "C2P": c2p, "P2C": p2c, "DOT_PRECISION": "ieee"}
                            config = {"dtype": dt, "head_dims": dims, "BLOCK_M": s.block_m, "BLOCK_N": s.block_n,
                                      "BLOCK_D": bd, "mask": has_mask, "varlen": varlen, "dropout": dropout,
                                      "c2p": c2p, "p2c": p2c}
                            yield kernel_build(f"disentangled_{kernel}", fn, s, dt, constexprs, config)
