"""The attention backward kernels and the @triton.jit helpers they inline: the preprocessing
kernel that computes delta = rowsum(dO * O), the dk / dv kernel (one program per key tile,
looping over the query tiles) with its loop step and its final scaling and masking of the
gradients, and the dq kernel (one program per query tile, looping over the key tiles) with its
row statistics, its loop step and the exact-delta correction it also stores for the dk / dv
kernel. With ROPE, dk and dq (and p k) accumulate as the two halves of the gradient of the
rotated tile (`rope`); with WINDOW and REL_BIAS the scores take the window and the
relative bias (`distance`), and the dk / dv kernel also adds up the bias's gradient.
The design is described in `fastbert.kernels.attention`, whose launchers run them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import (
    NO_SPECIALIZE,
    dropout_keep,
    even_tiles,
    load_tile,
    load_vec,
    mask_scores,
    sequence_span,
    store_tile,
    store_vec,
)
from .distance import distance_scores, head_row, rel_grad, tile_range
from .rope import dot_acc, dot_qk, load_qk, store_grad


@triton.jit(do_not_specialize=["stride_lb", "stride_lh", "rows_total"])
def attention_bwd_preprocess_kernel(
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
    o = load_tile(OUT + offs_m[:, None] * stride_os + offs_d[None, :], offs_m, limit, offs_d, head_dim, True)
    do = load_tile(DO + offs_m[:, None] * stride_dos + offs_d[None, :], offs_m, limit, offs_d, head_dim, True)
    tl.store(DELTA + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=offs_m < limit)


# --------------------------------------------------------------------------------------------
# dk, dv


@triton.jit
def _dkdv_query_tile(
    dk_a, dk_b, dv,  # the key tile's running gradients (dk: as its halves with ROPE)
    k_a, k_b, v, key_real, Q, DO, stride_qs, stride_dos, LSE, DELTA, COS, SIN, REL, DREL,
    start_n, start_m, cols, offs_m, offs_d, offs_h, lo, hi, head_dim, half, qk_scale, drop_scale, seed, bh, threshold,
    window, rel_n, HAS_DROPOUT: tl.constexpr, CHECK: tl.constexpr, ROPE: tl.constexpr, WINDOW: tl.constexpr,
    REL_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # One step of the query loop: the queries start_m + offs_m added into (dk, dv) (and, REL_BIAS,
    # their diagonal sums of dS into DREL)
    rows = start_m + offs_m
    q_row = tl.cast(start_m, tl.int64)
    q_a, q_b = load_qk(Q + q_row * stride_qs, offs_m[:, None] * stride_qs, rows, hi, offs_d, head_dim, offs_h, half,
                       COS, SIN, ROPE, CHECK)
    # rows past hi read lse = +inf: their probabilities are 0
    lse = load_vec(LSE + rows, rows, hi, float("inf"), CHECK)
    sT = dot_qk(k_a, k_b, q_a, q_b, ROPE, DOT_PRECISION)
    sT = distance_scores(sT, qk_scale, REL, rows[None, :], cols[:, None], window, rel_n, WINDOW, REL_BIAS, CHECK)
    sc = 1. if REL_BIAS else qk_scale  # what takes sT to the log2 domain (with the bias it is there)
    pT = tl.math.exp2(sT * sc - lse[None, :])
    do = load_tile(DO + q_row * stride_dos + (offs_m[:, None] * stride_dos + offs_d[None, :]), rows, hi,
                   offs_d, head_dim, CHECK)
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    if HAS_DROPOUT:
        keepT = dropout_keep(seed, bh, (rows - lo)[None, :], (cols - lo)[:, None], threshold)
        dv = tl.dot(tl.where(keepT, pT, 0.).to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dpT = tl.where(keepT, dpT * drop_scale, 0.)
    else:
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    delta = load_vec(DELTA + rows, rows, hi, 0., CHECK)
    dsT = pT * (dpT - delta[None, :])
    if REL_BIAS:
        rel_grad(DREL, dsT, key_real, start_n, start_m, rel_n, BLOCK_N, BLOCK_M, CHECK)
    dk_a, dk_b = dot_acc(dsT, q_a, q_b, dk_a, dk_b, ROPE, DOT_PRECISION)
    return dk_a, dk_b, dv


@triton.jit
def _dkdv_rel(REL, DREL, h, rel_n, MASK, b, stride_mb, cols, hi, seq, HAS_MASK: tl.constexpr,
              REL_BIAS: tl.constexpr):
    # (REL, DREL, key_real) for the key tile: the bias and its gradient at head h's rows
    # (REL_BIAS), and [BLOCK_N] bool, its real keys (below hi; with HAS_MASK, a one in the mask),
    # which only REL_BIAS reads (the mask is loaded for it only)
    real = cols < hi
    if REL_BIAS:
        if HAS_MASK:
            real = real & (tl.load(MASK + b.to(tl.int64) * stride_mb + cols, mask=cols < seq, other=0) != 0)
    return head_row(REL, h, rel_n, REL_BIAS), head_row(DREL, h, rel_n, REL_BIAS), real


@triton.jit
def _dkdv_finish(dk_a, dk_b, dv, MASK, b, stride_mb, cols, seq, sm_scale, drop_scale,
                 HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, ROPE: tl.constexpr):
    # (dk, dv) of the key tile once every query is added in: scaled, and zero on masked keys
    if HAS_DROPOUT:
        dv = dv * drop_scale
    dk_a = dk_a * sm_scale
    if ROPE:
        dk_b = dk_b * sm_scale
    if HAS_MASK:
        # padded and masked keys have no gradient, whatever their (never normalised) columns of pT held
        real = tl.load(MASK + b.to(tl.int64) * stride_mb + cols, mask=cols < seq, other=0) != 0
        dk_a = tl.where(real[:, None], dk_a, 0.)
        if ROPE:
            dk_b = tl.where(real[:, None], dk_b, 0.)
        dv = tl.where(real[:, None], dv, 0.)
    return dk_a, dk_b, dv


@triton.heuristics({"EVEN": even_tiles})
@triton.jit(do_not_specialize=NO_SPECIALIZE)
def attention_bwd_dkdv_kernel(
    DK, stride_dkb, stride_dkh, stride_dks,  # [B, H, S, D] out (varlen: [T, H, D]), k.dtype
    DV, stride_dvb, stride_dvh, stride_dvs,  # like DK, v.dtype
    DREL,  # [H, 2n - 1] out, fp32, zeroed: the relative bias's gradient, added into atomically (REL_BIAS only)
    Q, stride_qb, stride_qh, stride_qs,  # [B, H, S, D] (varlen: [T, H, D]; stride_qb = stride_qs)
    K, stride_kb, stride_kh, stride_ks,  # like Q
    V, stride_vb, stride_vh, stride_vs,  # like Q
    DO, stride_dob, stride_doh, stride_dos,  # like Q: gradient of the output
    LSE, DELTA, stride_lb, stride_lh,  # [B, H, S] (varlen: [H, T]), fp32: from the forward / preprocess
    MASK, stride_mb,  # [B, S] bool key mask (HAS_MASK only)
    RANGES,  # [B, 2] int32 [lo, hi) of each row of MASK (HAS_MASK only)
    CU_SEQLENS,  # [B + 1] int32 (VARLEN only)
    ROPE_COS, ROPE_SIN,  # [P, D / 2] fp32, contiguous: the rotary angles' cos, sin at positions 0.. (ROPE only)
    REL, rel_n,  # [H, 2n - 1] fp32, contiguous, and n: the relative bias times log2(e), at j - i + n - 1 (REL_BIAS)
    window,  # local attention: keys at most this many positions away (WINDOW only)
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
    HAS_MASK: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    ROPE: tl.constexpr,  # rotary: q and k rotated as they are loaded, dq and dk rotated back
    WINDOW: tl.constexpr, REL_BIAS: tl.constexpr,  # local attention; the relative bias REL added to the scaled scores
    EVEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # The transposed problem (keys along dim 0): sT = k q^T, pT = exp2(sT - lse),
    # dv += pT_dropped do, dpT = v do^T (dropped), dsT = pT (dpT - delta), dk += dsT q.
    start_n = tl.program_id(0) * BLOCK_N
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = sequence_span(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
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
    offs_h = tl.arange(0, BLOCK_D // 2)  # ROPE: the columns of one half of the head dim
    half = head_dim // 2
    CHECK: tl.constexpr = not EVEN
    # a key tile wholly outside [lo, hi) loads nothing and runs no query loop: dk = dv = 0; the
    # others visit the query tiles of [lo, hi), or (WINDOW) those within the window of one of their keys
    m_start, m_end, active = tile_range(start_n, lo, hi, window, BLOCK_N, BLOCK_M, WINDOW)
    k_limit = tl.where(active, hi, 0)
    k_a, k_b = load_qk(K + cols[:, None] * stride_ks, 0, cols, k_limit, offs_d, head_dim, offs_h, half,
                       ROPE_COS, ROPE_SIN, ROPE, CHECK)
    v = load_tile(V + cols[:, None] * stride_vs + offs_d[None, :], cols, k_limit, offs_d, head_dim, CHECK)

    dk_a = tl.zeros([BLOCK_N, BLOCK_D // 2 if ROPE else BLOCK_D], tl.float32)  # dk; with ROPE its first half
    dk_b = dk_a  # with ROPE its second half (else never touched)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    REL, DREL, key_real = _dkdv_rel(REL, DREL, h, rel_n, MASK, b, stride_mb, cols, hi, seq, HAS_MASK, REL_BIAS)
    for start_m in range(m_start, m_end, BLOCK_M):
        dk_a, dk_b, dv = _dkdv_query_tile(dk_a, dk_b, dv, k_a, k_b, v, key_real, Q, DO, stride_qs, stride_dos, LSE,
                                          DELTA, ROPE_COS, ROPE_SIN, REL, DREL, start_n, start_m, cols, offs_m, offs_d,
                                          offs_h, lo, hi, head_dim, half, qk_scale, drop_scale, seed, bh, threshold,
                                          window, rel_n, HAS_DROPOUT, CHECK, ROPE, WINDOW, REL_BIAS, BLOCK_N, BLOCK_M,
                                          DOT_PRECISION)

    dk_a, dk_b, dv = _dkdv_finish(dk_a, dk_b, dv, MASK, b, stride_mb, cols, seq, sm_scale, drop_scale, HAS_MASK,
                                  HAS_DROPOUT, ROPE)
    row_limit = hi if VARLEN else seq
    store_grad(DK + cols[:, None] * stride_dks, 0, dk_a, dk_b, cols, row_limit, offs_d, head_dim, offs_h, half,
               ROPE_COS, ROPE_SIN, ROPE, CHECK)
    store_tile(DV + cols[:, None] * stride_dvs + offs_d[None, :], dv, cols, row_limit, offs_d, head_dim, CHECK)


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
    dq_a, dq_b, pk_a, pk_b, p_dp, p_sum,  # the query tile's running sums (dq, pk: as their halves with ROPE)
    q_a, q_b, do, lse, delta, K, V, stride_ks, stride_vs, MASK, COS, SIN, REL,
    start_n, rows, offs_n, offs_d, offs_h, lo, hi, head_dim, half, qk_scale, drop_scale, seed, bh, threshold,
    window, rel_n, HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, CHECK: tl.constexpr, ROPE: tl.constexpr,
    WINDOW: tl.constexpr, REL_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # One step of the key loop: the keys start_n + offs_n added into (dq, pk, p_dp, p_sum)
    cols = start_n + offs_n
    kv_row = tl.cast(start_n, tl.int64)
    k_a, k_b = load_qk(K + kv_row * stride_ks, offs_n[:, None] * stride_ks, cols, hi, offs_d, head_dim, offs_h, half,
                       COS, SIN, ROPE, CHECK)
    s = dot_qk(q_a, q_b, k_a, k_b, ROPE, DOT_PRECISION)
    s = distance_scores(s, qk_scale, REL, rows[:, None], cols[None, :], window, rel_n, WINDOW, REL_BIAS, CHECK)
    s = mask_scores(s, MASK, cols, hi, HAS_MASK, CHECK)
    sc = 1. if REL_BIAS else qk_scale  # what takes s to the log2 domain (with the bias it is there)
    p = tl.math.exp2(s * sc - lse[:, None])
    v = load_tile(V + kv_row * stride_vs + (offs_n[:, None] * stride_vs + offs_d[None, :]), cols, hi, offs_d,
                  head_dim, CHECK)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    if HAS_DROPOUT:
        keep = dropout_keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold)
        dp = tl.where(keep, dp * drop_scale, 0.)
    ds = p * (dp - delta[:, None])
    p_dp += tl.sum(p * dp, 1)
    p_sum += tl.sum(p, 1)
    dq_a, dq_b = dot_acc(ds, k_a, k_b, dq_a, dq_b, ROPE, DOT_PRECISION)
    pk_a, pk_b = dot_acc(p, k_a, k_b, pk_a, pk_b, ROPE, DOT_PRECISION)
    return dq_a, dq_b, pk_a, pk_b, p_dp, p_sum


@triton.jit
def _dq_exact(dq_a, dq_b, pk_a, pk_b, p_dp, p_sum, delta, sm_scale, ROPE: tl.constexpr):
    # (dq, delta_exact) of the query tile once every key is added in (dq: as its halves with ROPE).
    # delta from the rounded output is off by dO . (O - round(O)), which would leave a gradient of
    # that size where the true one is 0 (a query with one real key). The exact delta is the
    # p-weighted mean of dp (normalised by the recomputed row sum, so that sum_j p (dp - delta) = 0
    # holds for these very p, whatever rounding put in them), and
    # dq = scale * sum_j p (dp - delta_exact) k = dq_above + scale * (delta - delta_exact) * p k
    delta_exact = tl.where(p_sum > 0., p_dp / tl.where(p_sum > 0., p_sum, 1.), 0.)
    dq_a = (dq_a + (delta - delta_exact)[:, None] * pk_a) * sm_scale
    if ROPE:
        dq_b = (dq_b + (delta - delta_exact)[:, None] * pk_b) * sm_scale
    return dq_a, dq_b, delta_exact


@triton.heuristics({"EVEN": even_tiles})
@triton.jit(do_not_specialize=NO_SPECIALIZE)
def attention_bwd_dq_kernel(
    DQ, stride_dqb, stride_dqh, stride_dqs,  # [B, H, S, D] out (varlen: [T, H, D]), q.dtype
    Q, stride_qb, stride_qh, stride_qs,  # [B, H, S, D] (varlen: [T, H, D]; stride_qb = stride_qs)
    K, stride_kb, stride_kh, stride_ks,  # like Q
    V, stride_vb, stride_vh, stride_vs,  # like Q
    DO, stride_dob, stride_doh, stride_dos,  # like Q: gradient of the output
    LSE, DELTA, stride_lb, stride_lh,  # [B, H, S] (varlen: [H, T]), fp32: from the forward / preprocess
    MASK, stride_mb,  # [B, S] bool key mask (HAS_MASK only)
    RANGES,  # [B, 2] int32 [lo, hi) of each row of MASK (HAS_MASK only)
    CU_SEQLENS,  # [B + 1] int32 (VARLEN only)
    ROPE_COS, ROPE_SIN,  # [P, D / 2] fp32, contiguous: the rotary angles' cos, sin at positions 0.. (ROPE only)
    REL, rel_n,  # [H, 2n - 1] fp32, contiguous, and n: the relative bias times log2(e), at j - i + n - 1 (REL_BIAS)
    window,  # local attention: keys at most this many positions away (WINDOW only)
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
    HAS_MASK: tl.constexpr, VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    ROPE: tl.constexpr,  # rotary: q and k rotated as they are loaded, dq and dk rotated back
    WINDOW: tl.constexpr, REL_BIAS: tl.constexpr,  # local attention; the relative bias REL added to the scaled scores
    EVEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # s = q k^T, p = exp2(s - lse), dp = do v^T (dropped), ds = p (dp - delta), dq += ds k
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = sequence_span(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
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
    REL = head_row(REL, h, rel_n, REL_BIAS)
    bh = b * heads + h

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_h = tl.arange(0, BLOCK_D // 2)  # ROPE: the columns of one half of the head dim
    half = head_dim // 2
    CHECK: tl.constexpr = not EVEN
    n_start, n_end, active = tile_range(start_m, lo, hi, window, BLOCK_M, BLOCK_N, WINDOW)
    q_limit = tl.where(active, hi, 0)
    q_a, q_b = load_qk(Q + rows[:, None] * stride_qs, 0, rows, q_limit, offs_d, head_dim, offs_h, half,
                       ROPE_COS, ROPE_SIN, ROPE, CHECK)
    do = load_tile(DO + rows[:, None] * stride_dos + offs_d[None, :], rows, q_limit, offs_d, head_dim, CHECK)
    lse, delta = _dq_row_stats(LSE, DELTA, rows, lo, q_limit, CHECK)

    dq_a = tl.zeros([BLOCK_M, BLOCK_D // 2 if ROPE else BLOCK_D], tl.float32)  # dq; with ROPE its first half
    pk_a = dq_a  # p k, the correction's direction; likewise
    dq_b, pk_b = dq_a, dq_a  # with ROPE their second halves (else never touched)
    p_dp = tl.zeros([BLOCK_M], tl.float32)  # rowsum(p * dp)
    p_sum = tl.zeros([BLOCK_M], tl.float32)  # rowsum(p): 1 but for rounding
    for start_n in range(n_start, n_end, BLOCK_N):
        dq_a, dq_b, pk_a, pk_b, p_dp, p_sum = _dq_key_tile(
            dq_a, dq_b, pk_a, pk_b, p_dp, p_sum, q_a, q_b, do, lse, delta, K, V, stride_ks, stride_vs, MASK,
            ROPE_COS, ROPE_SIN, REL, start_n, rows, offs_n, offs_d, offs_h, lo, hi, head_dim, half, qk_scale,
            drop_scale, seed, bh, threshold, window, rel_n, HAS_MASK, HAS_DROPOUT, CHECK, ROPE, WINDOW, REL_BIAS,
            DOT_PRECISION)

    dq_a, dq_b, delta_exact = _dq_exact(dq_a, dq_b, pk_a, pk_b, p_dp, p_sum, delta, sm_scale, ROPE)
    row_limit = hi if VARLEN else seq
    store_grad(DQ + rows[:, None] * stride_dqs, 0, dq_a, dq_b, rows, row_limit, offs_d, head_dim, offs_h, half,
               ROPE_COS, ROPE_SIN, ROPE, CHECK)
    # the exact delta, for the dk / dv kernel that runs next (0 on rows outside [lo, hi), as before)
    store_vec(DELTA + rows, delta_exact, rows, row_limit, CHECK)
