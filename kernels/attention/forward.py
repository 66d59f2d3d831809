"""The attention forward kernel, `attention_fwd_kernel`, and the @triton.jit helpers it inlines:
the debug write of the dropout keep-mask, one step of the online softmax over a tile of keys
(with the relative bias and the window of `distance`, and the dropout of its
probabilities), and the normalisation of the finished rows into the output and their
log2-sum-exp2. The design (tiling, padding, dropout counters, variants) is described in
`fastbert.kernels.attention`, whose launchers run it.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import (
    NO_SPECIALIZE,
    dropout_keep,
    even_tiles,
    load_tile,
    mask_scores,
    sequence_span,
    store_tile,
    store_vec,
)
from .distance import distance_scores, finite_max, head_row, tile_range
from .rope import dot_qk, load_qk


@triton.jit
def _write_keep_mask(KEEP, rows, offs_n, lo, seq, seed, bh, threshold, BLOCK_N: tl.constexpr,
                     RETURN_MASK: tl.constexpr):
    # Pointers to rows `rows` of the keep-mask block KEEP, which only RETURN_MASK reads (without
    # it they are never used, and compile away). With RETURN_MASK, the debug output, first (while
    # no tile is live): these rows of the keep-mask, every column; the key loop reads its mask
    # back from it, so it is the mask used
    KEEP_rows = KEEP + rows.to(tl.int64)[:, None] * seq
    if RETURN_MASK:
        for start_n in range(0, seq, BLOCK_N):
            cols = start_n + offs_n
            keep = dropout_keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold)
            tl.store(KEEP_rows + cols[None, :], keep, mask=(rows < seq)[:, None] & (cols < seq)[None, :])
        tl.debug_barrier()  # other threads of the program read it back
    return KEEP_rows


@triton.jit
def _fwd_key_tile(
    acc, m_i, l_i,  # the running state of the query tile's rows
    q_a, q_b, K, V, stride_ks, stride_vs, MASK, KEEP_rows, COS, SIN, REL,
    start_n, rows, offs_n, offs_d, offs_h, lo, hi, seq, head_dim, half, qk_scale, seed, bh, threshold, window, rel_n,
    HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, RETURN_MASK: tl.constexpr, CHECK: tl.constexpr,
    ROPE: tl.constexpr, WINDOW: tl.constexpr, REL_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # One step of the online softmax: the keys start_n + offs_n folded into (acc, m_i, l_i)
    cols = start_n + offs_n
    kv_row = tl.cast(start_n, tl.int64)
    k_a, k_b = load_qk(K + kv_row * stride_ks, offs_n[:, None] * stride_ks, cols, hi, offs_d, head_dim, offs_h, half,
                       COS, SIN, ROPE, CHECK)
    s = dot_qk(q_a, q_b, k_a, k_b, ROPE, DOT_PRECISION)
    s = distance_scores(s, qk_scale, REL, rows[:, None], cols[None, :], window, rel_n, WINDOW, REL_BIAS, CHECK)
    s = mask_scores(s, MASK, cols, hi, HAS_MASK, CHECK)
    sc = 1. if REL_BIAS else qk_scale  # what takes s to the log2 domain (with the bias it is there)
    # Without a window the first tile starts at lo, a real key of every row: m_new is finite from
    # then on. With one, a row may meet no key of its window before a later tile (finite_max)
    m_new = tl.maximum(m_i, tl.max(s, 1) * sc)
    m_ref = finite_max(m_new, WINDOW)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s * sc - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if HAS_DROPOUT:
        if RETURN_MASK:
            keep = tl.load(KEEP_rows + cols[None, :], mask=(rows < seq)[:, None] & (cols < seq)[None, :],
                           other=0) != 0
        else:
            keep = dropout_keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold)
        p = tl.where(keep, p, 0.)
    v = load_tile(V + kv_row * stride_vs + (offs_n[:, None] * stride_vs + offs_d[None, :]), cols, hi, offs_d,
                  head_dim, CHECK)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _fwd_rows_out(acc, m_i, l_i, MASK, rows, lo, hi, drop_scale,
                  HAS_MASK: tl.constexpr, HAS_DROPOUT: tl.constexpr, EVEN: tl.constexpr):
    # (out, lse) of the query tile once every key is folded in; a row that outputs zeros
    # (padding, or a hole in the mask) gets lse = +inf
    if HAS_DROPOUT:
        acc = acc * drop_scale
    if EVEN:
        out = acc / l_i[:, None]
        lse = m_i + tl.math.log2(l_i)
    else:
        real_row = (rows >= lo) & (rows < hi)
        if HAS_MASK:
            real_row = real_row & (tl.load(MASK + rows, mask=real_row, other=0) != 0)
        l_safe = tl.where(real_row, l_i, 1.)
        out = tl.where(real_row[:, None], acc / l_safe[:, None], 0.)
        lse = tl.where(real_row, m_i + tl.math.log2(l_safe), float("inf"))
    return out, lse


@triton.heuristics({"EVEN": even_tiles})
@triton.jit(do_not_specialize=NO_SPECIALIZE)
def attention_fwd_kernel(
    OUT, stride_ob, stride_oh, stride_os,  # [B, H, S, D] out (varlen: [T, H, D]), q.dtype
    LSE, stride_lb, stride_lh,  # [B, H, S] out (varlen: [H, T]), fp32: log2-sum-exp2 of the scaled scores
    KEEP,  # [B, H, S, S] out, bool: the dropout keep-mask (RETURN_MASK only)
    Q, stride_qb, stride_qh, stride_qs,  # [B, H, S, D] (varlen: [T, H, D]; stride_qb = stride_qs)
    K, stride_kb, stride_kh, stride_ks,  # like Q
    V, stride_vb, stride_vh, stride_vs,  # like Q
    MASK, stride_mb,  # [B, S] bool: key mask, 1 = real token (HAS_MASK only)
    RANGES,  # [B, 2] int32: [lo, hi) real positions of each row of MASK (HAS_MASK only)
    CU_SEQLENS,  # [B + 1] int32: sequence b is tokens CU_SEQLENS[b]:CU_SEQLENS[b + 1] (VARLEN only)
    ROPE_COS, ROPE_SIN,  # [P, D / 2] fp32, contiguous: the rotary angles' cos, sin at positions 0.. (ROPE only)
    REL, rel_n,  # [H, 2n - 1] fp32, contiguous, and n: the relative bias times log2(e), at j - i + n - 1 (REL_BIAS)
    window,  # local attention: keys at most this many positions away (WINDOW only)
    heads,  # H
    seq,  # S (varlen: max_seqlen)
    head_dim,  # D, a multiple of 16
    qk_scale,  # fp32: scale * log2(e)
    seed: tl.int64,  # dropout seed in [0, 2**63)
    threshold,  # i32: a probability is dropped when (u >> 8) < threshold
    drop_scale,  # fp32: 1 / (1 - p)
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per loop step
    BLOCK_D: tl.constexpr,  # D rounded up to a power of 2
    HAS_MASK: tl.constexpr,  # padded layout with a key mask
    VARLEN: tl.constexpr,  # packed layout
    HAS_DROPOUT: tl.constexpr,
    RETURN_MASK: tl.constexpr,  # write the dropout keep-mask to KEEP
    ROPE: tl.constexpr,  # rotate q and k by the angles of ROPE_COS, ROPE_SIN as they are loaded
    WINDOW: tl.constexpr, REL_BIAS: tl.constexpr,  # local attention; the relative bias REL added to the scaled scores
    EVEN: tl.constexpr,  # no mask, not varlen, S a multiple of BLOCK_M and BLOCK_N
    DOT_PRECISION: tl.constexpr,  # input_precision of the fp32 matrix products
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
    if HAS_MASK:
        MASK += b.to(tl.int64) * stride_mb
    bh = b * heads + h
    if RETURN_MASK:
        KEEP += bh.to(tl.int64) * seq * seq
    REL = head_row(REL, h, rel_n, REL_BIAS)

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_h = tl.arange(0, BLOCK_D // 2)  # ROPE: the columns of one half of the head dim
    half = head_dim // 2
    KEEP_rows = _write_keep_mask(KEEP, rows, offs_n, lo, seq, seed, bh, threshold, BLOCK_N, RETURN_MASK)

    CHECK: tl.constexpr = not EVEN
    # a query tile wholly outside [lo, hi) loads nothing and runs no key loop: its rows output zeros;
    # the others visit the key tiles of [lo, hi), or (WINDOW) those within the window of one of their rows
    n_start, n_end, active = tile_range(start_m, lo, hi, window, BLOCK_M, BLOCK_N, WINDOW)
    q_a, q_b = load_qk(Q + rows[:, None] * stride_qs, 0, rows, tl.where(active, hi, 0), offs_d, head_dim, offs_h, half,
                       ROPE_COS, ROPE_SIN, ROPE, CHECK)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max of the scaled scores
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running row sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(n_start, n_end, BLOCK_N):
        acc, m_i, l_i = _fwd_key_tile(acc, m_i, l_i, q_a, q_b, K, V, stride_ks, stride_vs, MASK, KEEP_rows,
                                      ROPE_COS, ROPE_SIN, REL, start_n, rows, offs_n, offs_d, offs_h, lo, hi, seq,
                                      head_dim, half, qk_scale, seed, bh, threshold, window, rel_n, HAS_MASK,
                                      HAS_DROPOUT, RETURN_MASK, CHECK, ROPE, WINDOW, REL_BIAS, DOT_PRECISION)

    out, lse = _fwd_rows_out(acc, m_i, l_i, MASK, rows, lo, hi, drop_scale, HAS_MASK, HAS_DROPOUT, EVEN)
    # varlen: rows past the sequence belong to the next one; padded: every row of the tile is ours
    row_limit = hi if VARLEN else seq
    store_tile(OUT + rows[:, None] * stride_os + offs_d[None, :], out, rows, row_limit, offs_d, head_dim, CHECK)
    store_vec(LSE + rows, lse, rows, row_limit, CHECK)
