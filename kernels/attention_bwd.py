"""The attention backward kernels and the @triton.jit helpers they inline: the preprocessing
kernel that computes delta = rowsum(dO * O), the dk / dv kernel (one program per key tile,
looping over the query tiles) with its loop step and its final scaling and masking of the
gradients, and the dq kernel (one program per query tile, looping over the key tiles) with its
row statistics, its loop step and the exact-delta correction it also stores for the dk / dv
kernel. The design is described in `fastbert.kernels.attention`, whose launchers run them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .attention_common import (
    _NO_SPECIALIZE,
    _even,
    _keep,
    _load_tile,
    _load_vec,
    _mask_scores,
    _sequence,
    _store_tile,
    _store_vec,
)


@triton.jit(do_not_specialize=["stride_lb", "stride_lh", "rows_total"])
def _attention_bwd_preprocess_kernel(
    DELTA, stride_lb, stride_lh,  # [B, H, S] out (varlen: [H, T]), fp32: rowsum(dO * O)
    OUT, stride_ob, stride_oh, stride_os,  # [B, H, S, D] (varlen: [T, H, D]): the forward's output
    DO, stride_dob, stride_doh, stride_dos,  # like OUT: its gradient
    rows_total,  # S (varlen: T)
    head_dim,  # D
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_D: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    m64 = start_m.to(tl.int64)
    OUT += b * stride_ob + h * stride_oh + m64 * stride_os
    DO += b * stride_dob + h * stride_doh + m64 * stride_dos
    DELTA += b * stride_lb + h * stride_lh + m64
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    limit = rows_total - start_m
    o = _load_tile(OUT + offs_m[:, None] * stride_os + offs_d[None, :], offs_m, limit, offs_d, head_dim, True)
    do = _load_tile(DO + offs_m[:, None] * stride_dos + offs_d[None, :], offs_m, limit, offs_d, head_dim, True)
    tl.store(DELTA + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=offs_m < limit)


# --------------------------------------------------------------------------------------------
# dk, dv


@triton.jit
def _dkdv_query_tile(
    dk, dv,  # the key tile's running gradients
    k, v, Q, DO, stride_qs, stride_dos, LSE, DELTA,
    start_m, cols, offs_m, offs_d, lo, hi, head_dim, qk_scale, drop_scale, seed, bh, threshold,
    HAS_DROPOUT: tl.constexpr, CHECK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # One step of the query loop: the queries start_m + offs_m added into (dk, dv)
    rows = start_m + offs_m
    q_row = tl.cast(start_m, tl.int64)
    q = _load_tile(Q + q_row * stride_qs + (offs_m[:, None] * stride_qs + offs_d[None, :]), rows, hi, offs_d,
                   head_dim, CHECK)
    # rows past hi read lse = +inf: their probabilities are 0
    lse = _load_vec(LSE + rows, rows, hi, float("inf"), CHECK)
    sT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
    pT = tl.math.exp2(sT * qk_scale - lse[None, :])
    do = _load_tile(DO + q_row * stride_dos + (offs_m[:, None] * stride_dos + offs_d[None, :]), rows, hi,
                    offs_d, head_dim, CHECK)
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    if HAS_DROPOUT:
        keepT = _keep(seed, bh, (rows - lo)[None, :], (cols - lo)[:, None], threshold)
        dv = tl.dot(tl.where(keepT, pT, 0.).to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dpT = tl.where(keepT, dpT * drop_scale, 0.)
    else:
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    delta = _load_vec(DELTA + rows, rows, hi, 0., CHECK)
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _dkdv_finish(dk, dv, MASK, b, stride_mb, cols, seq, sm_scale, drop_scale,
                 HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    # (dk, dv) of the key tile once every query is added in: scaled, and zero on masked keys
    if HAS_DROPOUT:
        dv = dv * drop_scale
    dk = dk * sm_scale
    if HAS_MASK:
        # padded and masked keys have no gradient, whatever their (never normalised) columns of pT held
        real = tl.load(MASK + b.to(tl.int64) * stride_mb + cols, mask=cols < seq, other=0) != 0
        dk = tl.where(real[:, None], dk, 0.)
        dv = tl.where(real[:, None], dv, 0.)
    return dk, dv


@triton.heuristics({"EVEN": _even})
@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attention_bwd_dkdv_kernel(
    DK, stride_dkb, stride_dkh, stride_dks,  # [B, H, S, D] out (varlen: [T, H, D]), k.dtype
    DV, stride_dvb, stride_dvh, stride_dvs,  # like DK, v.dtype
    Q, stride_qb, stride_qh, stride_qs,  # [B, H, S, D] (varlen: [T, H, D]; stride_qb = stride_qs)
    K, stride_kb, stride_kh, stride_ks,  # like Q
    V, stride_vb, stride_vh, stride_vs,  # like Q
    DO, stride_dob, stride_doh, stride_dos,  # like Q: gradient of the output
    LSE, DELTA, stride_lb, stride_lh,  # [B, H, S] (varlen: [H, T]), fp32: from the forward / preprocess
    MASK, stride_mb,  # [B, S] bool key mask (HAS_MASK only)
    RANGES,  # [B, 2] int32 [lo, hi) of each row of MASK (HAS_MASK only)
    CU_SEQLENS,  # [B + 1] int32 (VARLEN only)
    heads,  # H
    seq,  # S (varlen: max_seqlen)
    head_dim,  # D, a multiple of 16
    qk_scale,  # fp32: scale * log2(e)
    sm_scale,  # fp32: scale
    seed: tl.int64,  # dropout seed of the forward
    threshold,  # i32: a probability is dropped when (u >> 8) < threshold
    drop_scale,  # fp32: 1 / (1 - p)
    BLOCK_M: tl.constexpr,  # queries per loop step
    BLOCK_N: tl.constexpr,  # keys per program
    BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr,
    VARLEN: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    EVEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # The transposed problem (keys along dim 0): sT = k q^T, pT = exp2(sT - lse),
    # dv += pT_dropped do, dpT = v do^T (dropped), dsT = pT (dpT - delta), dk += dsT q.
    start_n = tl.program_id(0) * BLOCK_N
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = _sequence(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
    h64 = h.to(tl.int64)
    Q += off * stride_qb + h64 * stride_qh
    K += off * stride_kb + h64 * stride_kh
    V += off * stride_vb + h64 * stride_vh
    DO += off * stride_dob + h64 * stride_doh
    DK += off * stride_dkb + h64 * stride_dkh
    DV += off * stride_dvb + h64 * stride_dvh
    LSE += off * stride_lb + h64 * stride_lh
    DELTA += off * stride_lb + h64 * stride_lh
    bh = b * heads + h

    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    CHECK: tl.constexpr = not EVEN
    # a key tile wholly outside [lo, hi) loads nothing and runs no query loop: dk = dv = 0
    active = (start_n < hi) & (start_n + BLOCK_N > lo)
    m_end = tl.where(active, hi, lo)
    k_limit = tl.where(active, hi, 0)
    k = _load_tile(K + cols[:, None] * stride_ks + offs_d[None, :], cols, k_limit, offs_d, head_dim, CHECK)
    v = _load_tile(V + cols[:, None] * stride_vs + offs_d[None, :], cols, k_limit, offs_d, head_dim, CHECK)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start_m in range(lo, m_end, BLOCK_M):
        dk, dv = _dkdv_query_tile(dk, dv, k, v, Q, DO, stride_qs, stride_dos, LSE, DELTA,
                                  start_m, cols, offs_m, offs_d, lo, hi, head_dim, qk_scale, drop_scale, seed, bh,
                                  threshold, HAS_DROPOUT, CHECK, DOT_PRECISION)

    dk, dv = _dkdv_finish(dk, dv, MASK, b, stride_mb, cols, seq, sm_scale, drop_scale, HAS_MASK, HAS_DROPOUT)
    row_limit = hi if VARLEN else seq
    _store_tile(DK + cols[:, None] * stride_dks + offs_d[None, :], dk, cols, row_limit, offs_d, head_dim, CHECK)
    _store_tile(DV + cols[:, None] * stride_dvs + offs_d[None, :], dv, cols, row_limit, offs_d, head_dim, CHECK)


# --------------------------------------------------------------------------------------------
# dq


@triton.jit
def _dq_row_stats(LSE, DELTA, rows, lo, q_limit, CHECK: tl.constexpr):
    # (lse, delta) of the query tile's rows
    if CHECK:
        # rows outside [lo, hi) read lse = +inf: their probabilities, and so dq, are 0 (inside it
        # the forward stored +inf on the rows that output zeros)
        in_range = (rows >= lo) & (rows < q_limit)
        lse = tl.load(LSE + rows, mask=in_range, other=float("inf"))
        delta = tl.load(DELTA + rows, mask=in_range, other=0.)
    else:
        lse = tl.load(LSE + rows)
        delta = tl.load(DELTA + rows)
    return lse, delta


@triton.jit
def _dq_key_tile(
    dq, pk, p_dp, p_sum,  # the query tile's running sums
    q, do, lse, delta, K, V, stride_ks, stride_vs, MASK,
    start_n, rows, offs_n, offs_d, lo, hi, head_dim, qk_scale, drop_scale, seed, bh, threshold,
    HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, CHECK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # One step of the key loop: the keys start_n + offs_n added into (dq, pk, p_dp, p_sum)
    cols = start_n + offs_n
    kv_row = tl.cast(start_n, tl.int64)
    k = _load_tile(K + kv_row * stride_ks + (offs_n[:, None] * stride_ks + offs_d[None, :]), cols, hi, offs_d,
                   head_dim, CHECK)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    s = _mask_scores(s, MASK, cols, hi, HAS_MASK, CHECK)
    p = tl.math.exp2(s * qk_scale - lse[:, None])
    v = _load_tile(V + kv_row * stride_vs + (offs_n[:, None] * stride_vs + offs_d[None, :]), cols, hi, offs_d,
                   head_dim, CHECK)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    if HAS_DROPOUT:
        keep = _keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold)
        dp = tl.where(keep, dp * drop_scale, 0.)
    ds = p * (dp - delta[:, None])
    p_dp += tl.sum(p * dp, 1)
    p_sum += tl.sum(p, 1)
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    pk = tl.dot(p.to(k.dtype), k, pk, input_precision=DOT_PRECISION)
    return dq, pk, p_dp, p_sum


@triton.jit
def _dq_exact(dq, pk, p_dp, p_sum, delta, sm_scale):
    # (dq, delta_exact) of the query tile once every key is added in.
    # delta from the rounded output is off by dO . (O - round(O)), which would leave a gradient of
    # that size where the true one is 0 (a query with one real key). The exact delta is the
    # p-weighted mean of dp (normalised by the recomputed row sum, so that sum_j p (dp - delta) = 0
    # holds for these very p, whatever rounding put in them), and
    # dq = scale * sum_j p (dp - delta_exact) k = dq_above + scale * (delta - delta_exact) * p k
    delta_exact = tl.where(p_sum > 0., p_dp / tl.where(p_sum > 0., p_sum, 1.), 0.)
    dq = (dq + (delta - delta_exact)[:, None] * pk) * sm_scale
    return dq, delta_exact


@triton.heuristics({"EVEN": _even})
@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attention_bwd_dq_kernel(
    DQ, stride_dqb, stride_dqh, stride_dqs,  # [B, H, S, D] out (varlen: [T, H, D]), q.dtype
    Q, stride_qb, stride_qh, stride_qs,  # [B, H, S, D] (varlen: [T, H, D]; stride_qb = stride_qs)
    K, stride_kb, stride_kh, stride_ks,  # like Q
    V, stride_vb, stride_vh, stride_vs,  # like Q
    DO, stride_dob, stride_doh, stride_dos,  # like Q: gradient of the output
    LSE, DELTA, stride_lb, stride_lh,  # [B, H, S] (varlen: [H, T]), fp32: from the forward / preprocess
    MASK, stride_mb,  # [B, S] bool key mask (HAS_MASK only)
    RANGES,  # [B, 2] int32 [lo, hi) of each row of MASK (HAS_MASK only)
    CU_SEQLENS,  # [B + 1] int32 (VARLEN only)
    heads,  # H
    seq,  # S (varlen: max_seqlen)
    head_dim,  # D, a multiple of 16
    qk_scale,  # fp32: scale * log2(e)
    sm_scale,  # fp32: scale
    seed: tl.int64,  # dropout seed of the forward
    threshold,  # i32: a probability is dropped when (u >> 8) < threshold
    drop_scale,  # fp32: 1 / (1 - p)
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per loop step
    BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr,
    VARLEN: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    EVEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # s = q k^T, p = exp2(s - lse), dp = do v^T (dropped), ds = p (dp - delta), dq += ds k
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = _sequence(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
    h64 = h.to(tl.int64)
    Q += off * stride_qb + h64 * stride_qh
    K += off * stride_kb + h64 * stride_kh
    V += off * stride_vb + h64 * stride_vh
    DO += off * stride_dob + h64 * stride_doh
    DQ += off * stride_dqb + h64 * stride_dqh
    LSE += off * stride_lb + h64 * stride_lh
    DELTA += off * stride_lb + h64 * stride_lh
    if HAS_MASK:
        MASK += b.to(tl.int64) * stride_mb
    bh = b * heads + h

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    CHECK: tl.constexpr = not EVEN
    active = (start_m < hi) & (start_m + BLOCK_M > lo)
    n_end = tl.where(active, hi, lo)
    q_limit = tl.where(active, hi, 0)
    q = _load_tile(Q + rows[:, None] * stride_qs + offs_d[None, :], rows, q_limit, offs_d, head_dim, CHECK)
    do = _load_tile(DO + rows[:, None] * stride_dos + offs_d[None, :], rows, q_limit, offs_d, head_dim, CHECK)
    lse, delta = _dq_row_stats(LSE, DELTA, rows, lo, q_limit, CHECK)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pk = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # p k: the correction's direction
    p_dp = tl.zeros([BLOCK_M], tl.float32)  # rowsum(p * dp)
    p_sum = tl.zeros([BLOCK_M], tl.float32)  # rowsum(p): 1 but for rounding
    for start_n in range(lo, n_end, BLOCK_N):
        dq, pk, p_dp, p_sum = _dq_key_tile(dq, pk, p_dp, p_sum, q, do, lse, delta, K, V, stride_ks, stride_vs, MASK,
                                           start_n, rows, offs_n, offs_d, lo, hi, head_dim, qk_scale, drop_scale,
                                           seed, bh, threshold, HAS_MASK, HAS_DROPOUT, CHECK, DOT_PRECISION)

    dq, delta_exact = _dq_exact(dq, pk, p_dp, p_sum, delta, sm_scale)
    row_limit = hi if VARLEN else seq
    _store_tile(DQ + rows[:, None] * stride_dqs + offs_d[None, :], dq, rows, row_limit, offs_d, head_dim, CHECK)
    # the exact delta, for the dk / dv kernel that runs next (0 on rows outside [lo, hi), as before)
    _store_vec(DELTA + rows, delta_exact, rows, row_limit, CHECK)
