"""Flash attention with a padding mask, padded and packed (varlen), forward and backward.

    out = softmax(q k^T * scale, padded keys masked) v, with dropout on the probabilities.

Layout of this file: jit helpers and kernels, the launch settings table, the launchers
`attention_forward` / `attention_backward` / `varlen_attention_forward` /
`varlen_attention_backward` (plain Python; inputs arrive validated: q, k, v of one shape, dtype
and device, last dim contiguous), then `report_configs`.

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
share a variant. HAS_DROPOUT and RETURN_MASK (forward, not EVEN) are constexpr flags too.

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

import os
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..reference import dropout_threshold
from . import KernelBuild

_LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------
# jit helpers


@triton.jit
def _sequence(b, seq, RANGES, CU_SEQLENS, HAS_MASK: tl.constexpr, VARLEN: tl.constexpr):
    # (offset, lo, hi) of sequence b: offset is what multiplies the "batch" strides (b, or the
    # sequence's first token for varlen), [lo, hi) its real positions
    if VARLEN:
        first = tl.load(CU_SEQLENS + b)
        return first.to(tl.int64), 0, tl.load(CU_SEQLENS + b + 1) - first
    elif HAS_MASK:
        return b.to(tl.int64), tl.load(RANGES + 2 * b), tl.load(RANGES + 2 * b + 1)
    else:
        return b.to(tl.int64), 0, seq


@triton.jit
def _tile_mask(rows, limit, offs_d, head_dim, CHECK_ROWS: tl.constexpr):
    # [rows, BLOCK_D] bool: a real element (row < limit when CHECK_ROWS, column < head_dim)
    if CHECK_ROWS:
        return (rows < limit)[:, None] & (offs_d < head_dim)[None, :]
    else:
        return (offs_d < head_dim)[None, :]  # broadcast over the rows by tl.load / tl.store


@triton.jit
def _load_tile(ptrs, rows, limit, offs_d, head_dim, CHECK_ROWS: tl.constexpr):
    # [rows, BLOCK_D] tile, 0 outside _tile_mask
    return tl.load(ptrs, mask=_tile_mask(rows, limit, offs_d, head_dim, CHECK_ROWS), other=0.)


@triton.jit
def _store_tile(ptrs, value, rows, limit, offs_d, head_dim, CHECK_ROWS: tl.constexpr):
    # store a [rows, BLOCK_D] tile within _tile_mask, cast to the pointer's type
    tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=_tile_mask(rows, limit, offs_d, head_dim, CHECK_ROWS))


@triton.jit
def _load_vec(ptrs, rows, limit, other, CHECK_ROWS: tl.constexpr):
    # a per-row fp32 vector (lse, delta); rows >= limit read as `other`
    if CHECK_ROWS:
        return tl.load(ptrs, mask=rows < limit, other=other)
    else:
        return tl.load(ptrs)


@triton.jit
def _keep(seed, bh, i_rel, j_rel, threshold):
    # bool tile (broadcast of i_rel and j_rel, int32 positions from the sequence's first real
    # token): dropout keeps probability (i, j) of sequence-head bh = b * heads + h. The counter
    # bh * 2**32 + (i_rel & 0xFFFF) * 2**16 + (j_rel & 0xFFFF) as its low and high words, which
    # is exactly what tl.randint(seed, counter) hands to tl.philox.
    word_lo = (((i_rel & 0xFFFF) << 16) | (j_rel & 0xFFFF)).to(tl.uint32, bitcast=True)
    zero = word_lo * 0
    word_hi = zero + bh.to(tl.uint32)
    u, _, _, _ = tl.philox(seed, word_lo, word_hi, zero, zero)
    return (u >> 8).to(tl.int32) >= threshold


# --------------------------------------------------------------------------------------------
# kernels


@triton.jit(do_not_specialize=["RANGES", "MASK", "stride_mb", "seq"])
def _mask_range_kernel(
    RANGES,  # [B, 2] out, int32: first and one past the last real position of each row (0, 0 if none)
    MASK, stride_mb,  # [B, S] bool: key mask, 1 = real token
    seq,  # S
    BLOCK: tl.constexpr,  # columns per loop step
):
    b = tl.program_id(0)
    MASK += b.to(tl.int64) * stride_mb
    first = tl.full([BLOCK], seq, tl.int32)
    last = tl.full([BLOCK], -1, tl.int32)
    for start in range(0, seq, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        real = tl.load(MASK + cols, mask=cols < seq, other=0) != 0
        first = tl.minimum(first, tl.where(real, cols, seq))
        last = tl.maximum(last, tl.where(real, cols, -1))
    hi = tl.max(last, 0) + 1
    lo = tl.where(hi > 0, tl.min(first, 0), 0)
    tl.store(RANGES + 2 * b, lo)
    tl.store(RANGES + 2 * b + 1, hi)


def _even(args) -> bool:
    # no padding and whole tiles: no bounds checks at all
    return (not args["HAS_MASK"] and not args["VARLEN"]
            and args["seq"] % args["BLOCK_M"] == 0 and args["seq"] % args["BLOCK_N"] == 0)


# integer and pointer arguments whose values vary freely: no divisibility / ==1 specialization
_NO_SPECIALIZE = ["stride_lb", "stride_lh", "KEEP", "MASK", "stride_mb", "RANGES", "CU_SEQLENS", "heads", "seq",
                  "seed", "threshold"]


@triton.heuristics({"EVEN": _even})
@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attention_fwd_kernel(
    OUT, stride_ob, stride_oh, stride_os,  # [B, H, S, D] out (varlen: [T, H, D]), q.dtype
    LSE, stride_lb, stride_lh,  # [B, H, S] out (varlen: [H, T]), fp32: log2-sum-exp2 of the scaled scores
    KEEP,  # [B, H, S, S] out, bool: the dropout keep-mask (RETURN_MASK only)
    Q, stride_qb, stride_qh, stride_qs,  # [B, H, S, D] (varlen: [T, H, D]; stride_qb = stride_qs)
    K, stride_kb, stride_kh, stride_ks,  # like Q
    V, stride_vb, stride_vh, stride_vs,  # like Q
    MASK, stride_mb,  # [B, S] bool: key mask, 1 = real token (HAS_MASK only)
    RANGES,  # [B, 2] int32: [lo, hi) real positions of each row of MASK (HAS_MASK only)
    CU_SEQLENS,  # [B + 1] int32: sequence b is tokens CU_SEQLENS[b]:CU_SEQLENS[b + 1] (VARLEN only)
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
    EVEN: tl.constexpr,  # no mask, not varlen, S a multiple of BLOCK_M and BLOCK_N
    DOT_PRECISION: tl.constexpr,  # input_precision of the fp32 matrix products
):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2)
    off, lo, hi = _sequence(b, seq, RANGES, CU_SEQLENS, HAS_MASK, VARLEN)
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

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if RETURN_MASK:
        # the debug output, first (while no tile is live): these rows of the keep-mask, every
        # column; the key loop below reads its mask back from it, so it is the mask used
        KEEP_rows = KEEP + rows.to(tl.int64)[:, None] * seq
        for start_n in range(0, seq, BLOCK_N):
            cols = start_n + offs_n
            keep = _keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold)
            tl.store(KEEP_rows + cols[None, :], keep, mask=(rows < seq)[:, None] & (cols < seq)[None, :])
        tl.debug_barrier()  # other threads of the program read it back

    CHECK: tl.constexpr = not EVEN
    # a query tile wholly outside [lo, hi) loads nothing and runs no key loop: its rows output zeros
    active = (start_m < hi) & (start_m + BLOCK_M > lo)
    n_end = tl.where(active, hi, lo)
    q = _load_tile(Q + rows[:, None] * stride_qs + offs_d[None, :], rows, tl.where(active, hi, 0), offs_d,
                   head_dim, CHECK)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max of the scaled scores
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running row sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, n_end, BLOCK_N):
        cols = start_n + offs_n
        kv_row = tl.cast(start_n, tl.int64)
        k = _load_tile(K + kv_row * stride_ks + (offs_n[:, None] * stride_ks + offs_d[None, :]), cols, hi, offs_d,
                       head_dim, CHECK)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if HAS_MASK:
            real = tl.load(MASK + cols, mask=cols < hi, other=0) != 0
            s = tl.where(real[None, :], s, float("-inf"))
        elif CHECK:
            s = tl.where((cols < hi)[None, :], s, float("-inf"))
        # the first tile starts at lo, a real key of every row: m_new is finite from then on
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            if RETURN_MASK:
                keep = tl.load(KEEP_rows + cols[None, :], mask=(rows < seq)[:, None] & (cols < seq)[None, :],
                               other=0) != 0
            else:
                keep = _keep(seed, bh, (rows - lo)[:, None], (cols - lo)[None, :], threshold)
            p = tl.where(keep, p, 0.)
        v = _load_tile(V + kv_row * stride_vs + (offs_n[:, None] * stride_vs + offs_d[None, :]), cols, hi, offs_d,
                       head_dim, CHECK)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new

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
    # varlen: rows past the sequence belong to the next one; padded: every row of the tile is ours
    row_limit = hi if VARLEN else seq
    _store_tile(OUT + rows[:, None] * stride_os + offs_d[None, :], out, rows, row_limit, offs_d, head_dim, CHECK)
    if CHECK:
        tl.store(LSE + rows, lse, mask=rows < row_limit)
    else:
        tl.store(LSE + rows, lse)


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

    if HAS_DROPOUT:
        dv = dv * drop_scale
    dk = dk * sm_scale
    if HAS_MASK:
        # padded and masked keys have no gradient, whatever their (never normalised) columns of pT held
        real = tl.load(MASK + b.to(tl.int64) * stride_mb + cols, mask=cols < seq, other=0) != 0
        dk = tl.where(real[:, None], dk, 0.)
        dv = tl.where(real[:, None], dv, 0.)
    row_limit = hi if VARLEN else seq
    _store_tile(DK + cols[:, None] * stride_dks + offs_d[None, :], dk, cols, row_limit, offs_d, head_dim, CHECK)
    _store_tile(DV + cols[:, None] * stride_dvs + offs_d[None, :], dv, cols, row_limit, offs_d, head_dim, CHECK)


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
    if CHECK:
        # rows outside [lo, hi) read lse = +inf: their probabilities, and so dq, are 0 (inside it
        # the forward stored +inf on the rows that output zeros)
        in_range = (rows >= lo) & (rows < q_limit)
        lse = tl.load(LSE + rows, mask=in_range, other=float("inf"))
        delta = tl.load(DELTA + rows, mask=in_range, other=0.)
    else:
        lse = tl.load(LSE + rows)
        delta = tl.load(DELTA + rows)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pk = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # p k: the correction's direction
    p_dp = tl.zeros([BLOCK_M], tl.float32)  # rowsum(p * dp)
    p_sum = tl.zeros([BLOCK_M], tl.float32)  # rowsum(p): 1 but for rounding
    for start_n in range(lo, n_end, BLOCK_N):
        cols = start_n + offs_n
        kv_row = tl.cast(start_n, tl.int64)
        k = _load_tile(K + kv_row * stride_ks + (offs_n[:, None] * stride_ks + offs_d[None, :]), cols, hi, offs_d,
                       head_dim, CHECK)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if HAS_MASK:
            real = tl.load(MASK + cols, mask=cols < hi, other=0) != 0
            s = tl.where(real[None, :], s, float("-inf"))
        elif CHECK:
            s = tl.where((cols < hi)[None, :], s, float("-inf"))
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

    # delta from the rounded output is off by dO . (O - round(O)), which would leave a gradient of
    # that size where the true one is 0 (a query with one real key). The exact delta is the
    # p-weighted mean of dp (normalised by the recomputed row sum, so that sum_j p (dp - delta) = 0
    # holds for these very p, whatever rounding put in them), and
    # dq = scale * sum_j p (dp - delta_exact) k = dq_above + scale * (delta - delta_exact) * p k
    delta_exact = tl.where(p_sum > 0., p_dp / tl.where(p_sum > 0., p_sum, 1.), 0.)
    dq = (dq + (delta - delta_exact)[:, None] * pk) * sm_scale
    row_limit = hi if VARLEN else seq
    _store_tile(DQ + rows[:, None] * stride_dqs + offs_d[None, :], dq, rows, row_limit, offs_d, head_dim, CHECK)
    # the exact delta, for the dk / dv kernel that runs next (0 on rows outside [lo, hi), as before)
    if CHECK:
        tl.store(DELTA + rows, delta_exact, mask=rows < row_limit)
    else:
        tl.store(DELTA + rows, delta_exact)


# --------------------------------------------------------------------------------------------
# Launch settings: one table, used by the launchers and by report_configs alike.


class Settings(NamedTuple):
    block_m: int  # queries per tile
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    maxnreg: Optional[int]  # register budget given to ptxas (None: its own choice)


HEAD_DIMS = (16, 32, 64, 80, 96, 128)  # the head dims the kernels take (multiples of 16)
BLOCK_DS = (32, 64, 128)  # head dim blocks: D rounded up to a power of 2, at least 32
KERNELS = ("fwd", "bwd_preprocess", "bwd_dkdv", "bwd_dq")
_RANGE_SETTINGS = Settings(block_m=1, block_n=256, num_warps=4, num_stages=1, maxnreg=None)

# (kernel, 16-bit inputs?, BLOCK_D) -> settings. Every variant compiles for sm_80 and sm_90 with
# no spills (python -m fastbert.kernels.report --kernels attention). fp32 tiles are small: Triton
# holds a whole dot operand of a warp in registers, and tf32x3 holds it twice (big and small parts).
_TABLE = {
    # forward: BLOCK_M queries per program against key tiles of BLOCK_N
    ("fwd", True, 32): Settings(128, 64, 8, 2, None),
    ("fwd", True, 64): Settings(128, 64, 8, 2, None),
    ("fwd", True, 128): Settings(128, 32, 8, 2, None),
    ("fwd", False, 32): Settings(64, 32, 4, 2, None),
    ("fwd", False, 64): Settings(32, 32, 4, 2, None),
    ("fwd", False, 128): Settings(16, 32, 4, 2, None),
    # delta = rowsum(dO * O): BLOCK_M rows per program
    ("bwd_preprocess", True, 32): Settings(128, 1, 4, 1, None),
    ("bwd_preprocess", True, 64): Settings(64, 1, 4, 1, None),
    ("bwd_preprocess", True, 128): Settings(32, 1, 4, 1, None),
    ("bwd_preprocess", False, 32): Settings(64, 1, 4, 1, None),
    ("bwd_preprocess", False, 64): Settings(32, 1, 4, 1, None),
    ("bwd_preprocess", False, 128): Settings(16, 1, 4, 1, None),
    # dk / dv: BLOCK_N keys per program, BLOCK_M queries per loop step
    ("bwd_dkdv", True, 32): Settings(64, 32, 4, 2, None),
    ("bwd_dkdv", True, 64): Settings(64, 32, 8, 2, None),
    ("bwd_dkdv", True, 128): Settings(32, 64, 8, 2, None),
    ("bwd_dkdv", False, 32): Settings(16, 32, 4, 2, None),
    ("bwd_dkdv", False, 64): Settings(32, 16, 4, 2, None),
    ("bwd_dkdv", False, 128): Settings(16, 16, 4, 2, None),
    # dq: BLOCK_M queries per program, BLOCK_N keys per loop step
    ("bwd_dq", True, 32): Settings(64, 64, 4, 2, None),
    ("bwd_dq", True, 64): Settings(64, 32, 8, 2, None),
    ("bwd_dq", True, 128): Settings(64, 32, 8, 2, None),
    ("bwd_dq", False, 32): Settings(16, 32, 4, 2, None),
    ("bwd_dq", False, 64): Settings(16, 32, 4, 2, None),
    ("bwd_dq", False, 128): Settings(16, 16, 4, 2, None),
}


def block_d(head_dim: int) -> int:
    """The head dim block of `head_dim`: a power of 2, at least 32 (columns past D are masked)."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"fastbert: the Triton attention kernels take head_dim in {HEAD_DIMS}, got {head_dim}")
    return max(32, triton.next_power_of_2(head_dim))


def settings(head_dim: int, dtype: torch.dtype, kernel: str) -> Settings:
    """Tile shape and launch options of `kernel` (one of KERNELS) for q.dtype `dtype` and `head_dim`."""
    if kernel not in KERNELS:
        raise ValueError(f"fastbert: unknown attention kernel {kernel!r}; one of {KERNELS}")
    return _TABLE[(kernel, dtype != torch.float32, block_d(head_dim))]


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 on the GPU: three TF32 tensor-core products (about fp32 accuracy); the interpreter
    # computes every product exactly in fp32 whatever this says
    if dtype == torch.float32 and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "tf32x3"
    return "ieee"


def _launch_options(s: Settings) -> Dict[str, int]:
    options = {"num_warps": s.num_warps, "num_stages": s.num_stages}
    if s.maxnreg is not None:
        options["maxnreg"] = s.maxnreg
    return options


# --------------------------------------------------------------------------------------------
# Launchers


class _Dropout(NamedTuple):
    on: bool
    seed: int
    threshold: int
    scale: float


def _dropout(dropout_p: float, seed: Optional[int]) -> _Dropout:
    if dropout_p <= 0.0:
        return _Dropout(False, 0, 0, 1.0)
    if seed is None:
        raise ValueError("fastbert: attention with dropout_p > 0 needs a seed")
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"fastbert: dropout seed must be in [0, 2**63), got {seed}")
    scale = 1.0 / (1.0 - dropout_p) if dropout_p < 1.0 else 0.0
    return _Dropout(True, int(seed), dropout_threshold(dropout_p), scale)


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


def _optional(t: Optional[torch.Tensor], dtype: torch.dtype, device) -> torch.Tensor:
    # a variant that never reads a pointer argument still gets a tensor of its type
    return t if t is not None else torch.empty(0, dtype=dtype, device=device)


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


def _forward(q, k, v, out, lse, lse_strides, keep, mask, ranges, cu_seqlens, batch, seq, strides, scale, drop):
    """Launch the forward kernel. strides: (batch, head, row) strides of q, k, v, out (varlen:
    (token, head, token)); seq: S, or max_seqlen with cu_seqlens."""
    heads = q.shape[-2] if cu_seqlens is not None else q.shape[1]
    head_dim = q.shape[-1]
    _check_grid(batch, heads)
    s = settings(head_dim, q.dtype, "fwd")
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
        heads, seq, head_dim,
        scale * _LOG2E,
        drop.seed, drop.threshold, drop.scale,
        BLOCK_M=s.block_m, BLOCK_N=s.block_n, BLOCK_D=block_d(head_dim),
        HAS_MASK=mask is not None, VARLEN=cu_seqlens is not None, HAS_DROPOUT=drop.on,
        RETURN_MASK=keep is not None, DOT_PRECISION=_dot_precision(q.dtype),
        **_launch_options(s),
    )


def _backward(do, q, k, v, out, lse, lse_strides, mask, ranges, cu_seqlens, batch, seq, strides_of, scale, drop):
    """Launch the three backward kernels; (dq, dk, dv), fresh and contiguous. strides_of: a
    tensor's (batch, head, row) strides (_padded_strides or _varlen_strides)."""
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
        heads, seq, head_dim,
        scale * _LOG2E, scale,
        drop.seed, drop.threshold, drop.scale,
    )
    flags = dict(BLOCK_D=block_d(head_dim), HAS_MASK=mask is not None, VARLEN=varlen, HAS_DROPOUT=drop.on,
                 DOT_PRECISION=_dot_precision(q.dtype))
    # dq first: it also replaces delta by the exact rowsum(p * dp) that dk / dv then use
    s = settings(head_dim, q.dtype, "bwd_dq")
    _attention_bwd_dq_kernel[(triton.cdiv(seq, s.block_m), heads, batch)](
        dq, *g_st, *common, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **_launch_options(s),
    )
    s = settings(head_dim, q.dtype, "bwd_dkdv")
    _attention_bwd_dkdv_kernel[(triton.cdiv(seq, s.block_n), heads, batch)](
        dk, *g_st, dv, *g_st, *common, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **_launch_options(s),
    )
    return dq, dk, dv


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: Optional[torch.Tensor],
    scale: float,
    dropout_p: float,
    seed: Optional[int],
    return_dropout_mask: bool,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(out, lse, keep) of attention over a padded batch.

    q, k, v: [B, H, S, D] fp32/fp16/bf16, last dim contiguous, D in HEAD_DIMS; key_mask: None or
    [B, S] (nonzero = real token; any pattern, holes included); seed: a Python int in [0, 2**63)
    when dropout_p > 0. out: [B, H, S, D] contiguous, q.dtype, zeros at padded query positions;
    lse: fp32 [B, H, S] (for attention_backward); keep: bool [B, H, S, S], the dropout keep-mask
    the kernel drew, when return_dropout_mask and dropout_p > 0, else None.
    """
    batch, heads, seq, head_dim = q.shape
    drop = _dropout(dropout_p, seed)
    out = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    keep = None
    if return_dropout_mask and drop.on:
        keep = torch.empty((batch, heads, seq, seq), dtype=torch.bool, device=q.device)
    if out.numel() == 0:
        return out, lse, keep
    q, k, v = (_aligned(t) for t in (q, k, v))
    # the debug mask output is built into the masked and varlen variants only
    even = keep is None and _is_even(seq, settings(head_dim, q.dtype, "fwd"))
    mask, ranges = _key_mask(key_mask, batch, seq, q.device, even)
    strides = tuple(_padded_strides(t) for t in (q, k, v, out))
    _forward(q, k, v, out, lse, lse.stride()[:2], keep, mask, ranges, None, batch, seq, strides, scale, drop)
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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention_forward, [B, H, S, D] contiguous in q.dtype (zeros at padded
    positions). do: the gradient of out; out, lse: from attention_forward; the same key_mask,
    scale, dropout_p and seed (the dropout mask is regenerated, not stored)."""
    batch, heads, seq, head_dim = q.shape
    drop = _dropout(dropout_p, seed)
    if q.numel() == 0:
        return tuple(torch.zeros(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    q, k, v, out, do = (_aligned(t) for t in (q, k, v, out, do))
    even = _is_even(seq, settings(head_dim, q.dtype, "bwd_dkdv"), settings(head_dim, q.dtype, "bwd_dq"))
    mask, ranges = _key_mask(key_mask, batch, seq, q.device, even)
    return _backward(do, q, k, v, out, lse, lse.stride()[:2], mask, ranges, None, batch, seq, _padded_strides,
                     scale, drop)


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
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(out, lse, keep) of attention over packed sequences.

    q, k, v: [T, H, D], sequence b = tokens cu_seqlens[b]:cu_seqlens[b + 1] (int32 [B + 1], on
    q's device, cu_seqlens[B] = T); max_seqlen >= every length. out: [T, H, D] contiguous; lse:
    fp32 [H, T]; keep: bool [B, H, max_seqlen, max_seqlen] (sequence b in its top-left corner;
    the whole block follows the dropout rule) when return_dropout_mask and dropout_p > 0, else None.
    """
    total, heads, head_dim = q.shape
    batch = cu_seqlens.shape[0] - 1
    drop = _dropout(dropout_p, seed)
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
             scale, drop)
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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of varlen_attention_forward: [T, H, D] contiguous in q.dtype; the same
    cu_seqlens, max_seqlen, scale, dropout_p and seed as the forward."""
    batch = cu_seqlens.shape[0] - 1
    drop = _dropout(dropout_p, seed)
    if batch <= 0 or max_seqlen <= 0 or q.numel() == 0:
        return tuple(torch.zeros(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    q, k, v, out, do = (_aligned(t) for t in (q, k, v, out, do))
    return _backward(do, q, k, v, out, lse, (1, lse.stride(0)), None, None, cu_seqlens, batch, max_seqlen,
                     _varlen_strides, scale, drop)


# --------------------------------------------------------------------------------------------
# Build report: every variant the launchers above can compile.

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# arguments the kernels do not specialize (do_not_specialize): never marked divisible
_UNSPECIALIZED = {"stride_lb", "stride_lh", "stride_mb", "KEEP", "MASK", "RANGES", "CU_SEQLENS", "rows_total"}
# (HAS_MASK, VARLEN, EVEN) the launchers pick: no mask and whole tiles, padded with a key mask
# (also any other S without one), packed
_MODES = ((False, False, True), (True, False, False), (False, True, False))


def _arg_type(name: str, dt: str) -> str:
    if name in ("LSE", "DELTA"):
        return "*fp32"
    if name in ("KEEP", "MASK"):
        return "*u1"
    if name in ("RANGES", "CU_SEQLENS"):
        return "*i32"
    if name.isupper():
        return f"*{dt}"
    if name == "seed":
        return "i64"
    if name.endswith("scale"):
        return "fp32"
    return "i32"  # strides, sizes, threshold


def _build(name: str, fn, s: Settings, dt: str, constexprs: Dict[str, object], config: Dict[str, object]):
    while isinstance(fn, triton.runtime.Heuristics):
        fn = fn.fn  # the jit (or, interpreted, the interpreter's) function under @triton.heuristics
    signature = {a: _arg_type(a, dt) for a in fn.arg_names if a not in constexprs}
    # every pointer and stride of q, k, v, do and the outputs is a multiple of 16 (_aligned), and
    # so is head_dim
    divisible = tuple(a for a, ty in signature.items() if a not in _UNSPECIALIZED
                      and (ty.startswith("*") or a.startswith("stride") or a == "head_dim"))
    return KernelBuild(name, fn, signature, constexprs, s.num_warps, s.num_stages, config, divisible, s.maxnreg)


def report_configs() -> Iterator[KernelBuild]:
    """Every (kernel, settings, dtype, head dim block, flags) the launchers can pick."""
    s = _RANGE_SETTINGS
    yield _build("attention_mask_range", _mask_range_kernel, s, "fp32", {"BLOCK": s.block_n},
                 {"BLOCK_N": s.block_n})
    for dt, dtype in _DTYPES.items():
        precision = "tf32x3" if dtype == torch.float32 else "ieee"
        for bd in BLOCK_DS:
            dims = ",".join(str(d) for d in HEAD_DIMS if block_d(d) == bd)
            head_dim = next(d for d in HEAD_DIMS if block_d(d) == bd)
            s = settings(head_dim, dtype, "bwd_preprocess")
            yield _build("attention_bwd_preprocess", _attention_bwd_preprocess_kernel, s, dt,
                         {"BLOCK_M": s.block_m, "BLOCK_D": bd},
                         {"dtype": dt, "head_dims": dims, "BLOCK_M": s.block_m, "BLOCK_D": bd})
            for kernel, fn in (("fwd", _attention_fwd_kernel), ("bwd_dkdv", _attention_bwd_dkdv_kernel),
                               ("bwd_dq", _attention_bwd_dq_kernel)):
                s = settings(head_dim, dtype, kernel)
                for has_mask, varlen, even in _MODES:
                    for has_dropout, return_mask in ((False, False), (True, False), (True, True)):
                        if return_mask and (kernel != "fwd" or even):
                            continue  # the debug mask: forward only, never the EVEN variant
                        constexprs = {"BLOCK_M": s.block_m, "BLOCK_N": s.block_n, "BLOCK_D": bd,
                                      "HAS_MASK": has_mask, "VARLEN": varlen, "HAS_DROPOUT": has_dropout,
                                      "EVEN": even, "DOT_PRECISION": precision}
                        config = {"dtype": dt, "head_dims": dims, "BLOCK_M": s.block_m, "BLOCK_N": s.block_n,
                                  "BLOCK_D": bd, "mask": has_mask, "varlen": varlen, "even": even,
                                  "dropout": has_dropout}
                        if kernel == "fwd":
                            constexprs["RETURN_MASK"] = return_mask
                            config["return_mask"] = return_mask
                        yield _build(f"attention_{kernel}", fn, s, dt, constexprs, config)
