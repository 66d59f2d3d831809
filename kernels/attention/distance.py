"""Device code for the two attention options that depend on the distance j - i between key j and
query i: local (sliding-window) attention, WINDOW (query i sees the keys with |i - j| <= window),
and a relative position bias, REL_BIAS (rel[h, j - i + n - 1] added to the scaled score of head h,
MPNet's). The @triton.jit functions here give a tile's loop bounds over the other side, the
scores of a tile with the bias added and the window applied, and the bias gradient of a tile. The
design is described in `fastbert.kernels.attention`.

Positions are those of the rows and columns of the tiles, counted from the sequence's offset
(padded layout: the row, padding included; packed: the index within the sequence), as the
reference and the C++ kernels count them.

Window: the tiles of the other side are visited from the first on the grid lo + k * BLOCK that
holds a row within `window` of the tile's first row, to the last row within `window` of its last
row (clipped to [lo, hi)); every other tile is skipped, so a tile meets at most about
(BLOCK + 2 * window) / OTHER_BLOCK tiles, whatever the sequence's length. Inside the visited tiles
the pairs out of the window get the score -inf, as masked keys do. Tiles stay on lo's grid (not
at start - window) so that the EVEN variant's unchecked loads stay inside [0, S).

Relative bias: the table is read as fp32 times log2(e) (the launcher's copy), so that a tile's
scores are in the log2 domain once it is added: s * qk_scale + rel[j - i] (one multiply-add);
each element of the tile is a load of the head's row at j - i, contiguous along a row of the tile
(L1-resident: the row is 2n - 1 floats). Its gradient is the sum of dS = P (dP - delta) over each
diagonal j - i = d, summed over the batch. The dk / dv kernel has dS of its key tile against each
query tile, with the exact delta, and adds it into an fp32 [H, 2n - 1] buffer with relaxed
atomics: no [H, S, S] tensor anywhere, and no second pass over the scores. A tile of at least
1024 scores (the 16-bit kernels') is first reduced to its BLOCK_M + BLOCK_N - 1 diagonals: skewed
(tl.gather along the query axis, key row r shifted by r, so that each column of the skewed tile
is one diagonal) and summed by column, one atomic per diagonal per tile pair. A smaller tile (the
fp32 kernels', already at the register limit with tf32x3 operands) adds its elements one atomic
each: the skew's round trip through shared memory costs registers they do not have. Either way
the sum's order varies from run to run (fp32 atomics), so drel is not bitwise deterministic,
unlike dq, dk, dv; a deterministic per-tile buffer would take B * H * S^2 / BLOCK_N floats and
a second reduction pass.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_range(start, lo, hi, window, BLOCK: tl.constexpr, OTHER_BLOCK: tl.constexpr, WINDOW: tl.constexpr):
    # (first, end, active) for the tile of BLOCK rows at `start`: active when it meets [lo, hi),
    # and then the rows of the other side it visits, from first in steps of OTHER_BLOCK up to end:
    # every row of [lo, hi), or (WINDOW) the tiles of lo's grid that hold a row within `window` of
    # one of its rows. An inactive tile visits none (end = first)
    active = (start < hi) & (start + BLOCK > lo)
    if WINDOW:
        first = lo + tl.maximum(start - window - lo, 0) // OTHER_BLOCK * OTHER_BLOCK
        return first, tl.where(active, tl.minimum(hi, start + BLOCK + window), first), active
    else:
        return lo, tl.where(active, hi, lo), active


@triton.jit
def head_row(REL, h, rel_n, REL_BIAS: tl.constexpr):
    # REL (or its gradient) moved to head h's row [2n - 1], at distance 0 (REL_BIAS only)
    if REL_BIAS:
        REL += h * (2 * rel_n - 1) + rel_n - 1
    return REL


@triton.jit
def _rel_bias(REL, i, j, rel_n, CHECK: tl.constexpr):
    # rel[j - i] (i, j broadcast to a tile; REL: the head's row at its centre, entry n - 1), 0 where
    # |j - i| >= n (only a tile's rows past the sequence can be that far apart)
    d = j - i
    if CHECK:
        return tl.load(REL + d, mask=(d < rel_n) & (d > -rel_n), other=0.)
    else:
        return tl.load(REL + d)


@triton.jit
def distance_scores(s, qk_scale, REL, i, j, window, rel_n, WINDOW: tl.constexpr, REL_BIAS: tl.constexpr,
                    CHECK: tl.constexpr):
    # The scores q k^T of a tile (i, j: its query and key positions, broadcast to it) with the
    # relative bias added (REL_BIAS: then in the log2 domain, s * qk_scale + rel[j - i]; else left
    # unscaled) and the pairs farther apart than `window` at -inf (WINDOW)
    if REL_BIAS:
        s = s * qk_scale + _rel_bias(REL, i, j, rel_n, CHECK)
    if WINDOW:
        d = j - i
        s = tl.where((d <= window) & (d >= -window), s, float("-inf"))
    return s


@triton.jit
def finite_max(m, WINDOW: tl.constexpr):
    # The running row max as the exponentials take it. With WINDOW a row may have met no key of
    # its window yet (every score so far -inf): 0 then, so that exp2(-inf - 0) = 0, not NaN
    if WINDOW:
        return tl.where(m == float("-inf"), 0., m)
    else:
        return m


@triton.jit
def rel_grad(DREL, dsT, key_real, start_n, start_m, rel_n, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
             CHECK: tl.constexpr):
    # Add the diagonal sums of dsT [BLOCK_N keys from start_n, BLOCK_M queries from start_m] into
    # DREL (the head's row of the fp32 gradient, at its centre), over the real keys (key_real,
    # [BLOCK_N]: the masked keys' rows of dsT were never normalised). Key row r and query column u
    # lie at distance j - i = start_n - start_m + r - u; without CHECK every key is real and every
    # distance is within the table (|j - i| < S <= n).
    if BLOCK_M * BLOCK_N >= 1024:
        # Skewed: z[r, t] = dsT[r, r + BLOCK_M - 1 - t] (0 where that column is outside the tile)
        # has one diagonal per column t, at distance start_n - start_m - (BLOCK_M - 1) + t; its
        # column sums take one atomic each
        if CHECK:
            dsT = tl.where(key_real[:, None], dsT, 0.)
        T: tl.constexpr = 2 * BLOCK_M if BLOCK_M > BLOCK_N else 2 * BLOCK_N  # >= BLOCK_M + BLOCK_N - 1, a power of 2
        t = tl.arange(0, T)
        u = tl.arange(0, BLOCK_N)[:, None] + (BLOCK_M - 1) - t[None, :]
        z = tl.gather(dsT, tl.minimum(tl.maximum(u, 0), BLOCK_M - 1), 1)
        sums = tl.sum(tl.where((u >= 0) & (u < BLOCK_M), z, 0.), 0)
        d = start_n - start_m - (BLOCK_M - 1) + t
        in_tile = t < BLOCK_M + BLOCK_N - 1
        if CHECK:
            in_tile = in_tile & (d < rel_n) & (d > -rel_n)
        tl.atomic_add(DREL + d, sums, mask=in_tile, sem="relaxed")
    else:
        # A small tile (the fp32 kernels'): one atomic per element. The skew's round trip through
        # shared memory needs more registers than these kernels have left, and the atomics are
        # few next to the tile's tf32x3 products
        d = start_n - start_m + tl.arange(0, BLOCK_N)[:, None] - tl.arange(0, BLOCK_M)[None, :]
        if CHECK:
            tl.atomic_add(DREL + d, dsT, mask=key_real[:, None] & (d < rel_n) & (d > -rel_n), sem="relaxed")
        else:
            tl.atomic_add(DREL + d, dsT, sem="relaxed")
