"""Device code shared by the attention kernels of `forward` and `backward` (the design
is described in `fastbert.kernels.attention`): the @triton.jit helpers they inline (where a
sequence lies and its real positions, masked loads and stores of [rows, BLOCK_D] tiles and of
per-row vectors, the key mask applied to a tile of scores, the dropout keep rule), the kernel
that finds the real positions of each row of a key mask, and the `EVEN` heuristic and the list
of unspecialized arguments that the forward and backward kernels share.
"""
from __future__ import annotations

import triton
import triton.language as tl

# --------------------------------------------------------------------------------------------
# jit helpers


@triton.jit
def sequence_span(b, seq, RANGES, CU_SEQLENS, HAS_MASK: tl.constexpr, VARLEN: tl.constexpr):
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
def tile_mask(rows, limit, offs_d, head_dim, CHECK_ROWS: tl.constexpr):
    # [rows, BLOCK_D] bool: a real element (row < limit when CHECK_ROWS, column < head_dim)
    if CHECK_ROWS:
        return (rows < limit)[:, None] & (offs_d < head_dim)[None, :]
    else:
        return (offs_d < head_dim)[None, :]  # broadcast over the rows by tl.load / tl.store


@triton.jit
def load_tile(ptrs, rows, limit, offs_d, head_dim, CHECK_ROWS: tl.constexpr):
    # [rows, BLOCK_D] tile, 0 outside tile_mask
    return tl.load(ptrs, mask=tile_mask(rows, limit, offs_d, head_dim, CHECK_ROWS), other=0.)


@triton.jit
def store_tile(ptrs, value, rows, limit, offs_d, head_dim, CHECK_ROWS: tl.constexpr):
    # store a [rows, BLOCK_D] tile within tile_mask, cast to the pointer's type
    tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=tile_mask(rows, limit, offs_d, head_dim, CHECK_ROWS))


@triton.jit
def load_vec(ptrs, rows, limit, other, CHECK_ROWS: tl.constexpr):
    # a per-row fp32 vector (lse, delta); rows >= limit read as `other`
    if CHECK_ROWS:
        return tl.load(ptrs, mask=rows < limit, other=other)
    else:
        return tl.load(ptrs)


@triton.jit
def store_vec(ptrs, value, rows, limit, CHECK_ROWS: tl.constexpr):
    # store a per-row fp32 vector (lse, delta) on the rows < limit (every row without CHECK_ROWS)
    if CHECK_ROWS:
        tl.store(ptrs, value, mask=rows < limit)
    else:
        tl.store(ptrs, value)


@triton.jit
def mask_scores(s, MASK, cols, hi, HAS_MASK: tl.constexpr, CHECK: tl.constexpr):
    # [rows, cols] scores with the masked keys (HAS_MASK: a zero in MASK; otherwise, when CHECK,
    # the columns past hi) set to -inf
    if HAS_MASK:
        real = tl.load(MASK + cols, mask=cols < hi, other=0) != 0
        s = tl.where(real[None, :], s, float("-inf"))
    elif CHECK:
        s = tl.where((cols < hi)[None, :], s, float("-inf"))
    return s


@triton.jit
def dropout_keep(seed, bh, i_rel, j_rel, threshold):
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
# The key mask's real range, and what the forward and backward kernels share at launch


@triton.jit(do_not_specialize=["RANGES", "MASK", "stride_mb", "seq"])
def mask_range_kernel(
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


def even_tiles(args) -> bool:
    # no padding and whole tiles: no bounds checks at all
    return (not args["HAS_MASK"] and not args["VARLEN"]
            and args["seq"] % args["BLOCK_M"] == 0 and args["seq"] % args["BLOCK_N"] == 0)


# integer and pointer arguments whose values vary freely: no divisibility / ==1 specialization
NO_SPECIALIZE = ["stride_lb", "stride_lh", "KEEP", "MASK", "stride_mb", "RANGES", "CU_SEQLENS", "REL", "DREL",
                 "rel_n", "window", "heads", "seq", "seed", "threshold"]
