"""Device code for rotary position embedding (RoPE) inside the attention kernels: the @triton.jit
functions that load a q or k tile as the matrix products take it, multiply two such tiles, add a
product into a head-dim accumulator, and store a gradient tile. The design is described in
`fastbert.kernels.attention`.

Each has two forms, picked by the constexpr ROPE. Without it a tile is one [rows, BLOCK_D]
block (`a`; its partner `b` is the same tile, or an accumulator that nothing reads, and compiles
away), and they are the plain loads, tl.dot and stores. With it a tile is held as its two
halves over the head dim, a = columns [0, h) and b = columns [h, 2h) (h = head_dim / 2), each
[rows, BLOCK_D / 2] with the columns past h masked: register tiles cannot be permuted along
their columns, and RoPE pairs column i with column i + h. A loaded q or k tile is rotated in
fp32 by the angles of its rows' positions and cast back to its dtype for tl.dot:

    a' = a cos - b sin,   b' = b cos + a sin        (cos, sin: [rows, h], from the tables)

q k^T is then q_a' k_a'^T + q_b' k_b'^T (two products over h, the FLOPs of one over 2h), and a gradient
with respect to a rotated tile, accumulated in fp32 as its two halves (ga, gb), is rotated back
(the transpose) as it is stored:  ga cos + gb sin,  gb cos - ga sin.

Positions are the tile's row indices counted from the sequence's offset (padded layout: the row,
padding included; packed: the index within the sequence). The tables are read with the tile's
own mask, so nothing past the sequence (at most P rows of them) is ever read.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import load_tile, store_tile, tile_mask


@triton.jit
def _rope_angles(COS, SIN, rows, limit, offs_h, half, CHECK_ROWS: tl.constexpr):
    # (cos, sin) [rows, BLOCK_D / 2] fp32 at the positions `rows`, 0 outside the tile's mask;
    # the tables are [P, half] contiguous
    mask = tile_mask(rows, limit, offs_h, half, CHECK_ROWS)
    offs = rows[:, None] * half + offs_h[None, :]
    return tl.load(COS + offs, mask=mask, other=0.), tl.load(SIN + offs, mask=mask, other=0.)


@triton.jit
def load_qk(BASE, row_offs, rows, limit, offs_d, head_dim, offs_h, half, COS, SIN,
            ROPE: tl.constexpr, CHECK_ROWS: tl.constexpr):
    # A q or k tile, 0 outside the tile mask: (tile, tile) [rows, BLOCK_D]; with ROPE its rotated
    # halves (a', b'). Its rows start at BASE + row_offs: row_offs is 0 when BASE is a [rows, 1]
    # pointer tile, else the [rows, 1] int32 offsets of the rows from the scalar pointer BASE
    if ROPE:
        ptrs = BASE + (row_offs + offs_h[None, :])
        mask = tile_mask(rows, limit, offs_h, half, CHECK_ROWS)
        x_a = tl.load(ptrs, mask=mask, other=0.)
        x_b = tl.load(ptrs + half, mask=mask, other=0.)
        cos, sin = _rope_angles(COS, SIN, rows, limit, offs_h, half, CHECK_ROWS)
        a = x_a.to(tl.float32)
        b = x_b.to(tl.float32)
        # The select changes no value (all is 0 outside the mask already): it keeps the compiler
        # from redoing this rotation in the layout of each matrix product that reads the tile
        # (operand layouts replicate the tile across warps: hundreds of registers, and spills).
        # Computed once, the tile is stored to shared memory and read from there by each product.
        r_a = tl.where(mask, a * cos - b * sin, 0.)
        r_b = tl.where(mask, b * cos + a * sin, 0.)
        return r_a.to(x_a.dtype), r_b.to(x_a.dtype)
    else:
        x = load_tile(BASE + (row_offs + offs_d[None, :]), rows, limit, offs_d, head_dim, CHECK_ROWS)
        return x, x


@triton.jit
def dot_qk(x_a, x_b, y_a, y_b, ROPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # x y^T over the head dim, fp32 [rows of x, rows of y]; with ROPE the sum over both halves
    s = tl.dot(x_a, tl.trans(y_a), input_precision=DOT_PRECISION)
    if ROPE:
        s = tl.dot(x_b, tl.trans(y_b), s, input_precision=DOT_PRECISION)
    return s


@triton.jit
def dot_acc(p, y_a, y_b, acc_a, acc_b, ROPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # (acc_a, acc_b) + p y, fp32: p [rows, rows of y] (cast to y's dtype), y as load_qk gives it;
    # without ROPE acc_b is left as it is
    acc_a = tl.dot(p.to(y_a.dtype), y_a, acc_a, input_precision=DOT_PRECISION)
    if ROPE:
        acc_b = tl.dot(p.to(y_b.dtype), y_b, acc_b, input_precision=DOT_PRECISION)
    return acc_a, acc_b


@triton.jit
def store_grad(BASE, row_offs, g_a, g_b, rows, limit, offs_d, head_dim, offs_h, half, COS, SIN,
               ROPE: tl.constexpr, CHECK_ROWS: tl.constexpr):
    # Store the gradient tile (g_a) at BASE + row_offs (as in load_qk) within the tile mask, cast to the
    # pointer's type; with ROPE (g_a, g_b) is the gradient of the rotated halves, stored rotated back
    if ROPE:
        ptrs = BASE + (row_offs + offs_h[None, :])
        mask = tile_mask(rows, limit, offs_h, half, CHECK_ROWS)
        cos, sin = _rope_angles(COS, SIN, rows, limit, offs_h, half, CHECK_ROWS)
        tl.store(ptrs, (g_a * cos + g_b * sin).to(ptrs.dtype.element_ty), mask=mask)
        tl.store(ptrs + half, (g_b * cos - g_a * sin).to(ptrs.dtype.element_ty), mask=mask)
    else:
        store_tile(BASE + (row_offs + offs_d[None, :]), g_a, rows, limit, offs_d, head_dim, CHECK_ROWS)
