"""Fused bias + GELU over the last dim: y = gelu(x + bias), forward and backward.

BERT's intermediate layer, between its two feed-forward GEMMs. Layout of this file: jit helpers
and kernels, the launch settings table, the launchers `bias_gelu_forward` / `bias_gelu_backward`
(plain Python; inputs arrive validated, 2-D, contiguous, on one device), then `report_configs`.

approximate="none" is the exact erf GELU that BERT checkpoints use; "tanh" is the approximation
    gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))).
Everything is computed in fp32; y and dx are stored in x.dtype; dbias is reduced in fp32
without atomics (per-program partials, then a fixed-order sum), so it is deterministic.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch
import triton
import triton.language as tl

from . import Bound, KernelBuild, Settings, aligned_args, cdiv, fresh_or_given, launch, next_power_of_2, num_sms, split_rows

_SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
_TANH_COEF = tl.constexpr(0.044715)


@triton.jit
def _tanh(a):
    # tanh(a) = sign(a) (1 - e) / (1 + e) with e = exp(-2|a|) in (0, 1]: nothing overflows, and it
    # saturates to +-1 for large |a|.
    e = tl.exp(-2.0 * tl.abs(a))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(a < 0., -t, t)


@triton.jit
def gelu_tile(z, APPROXIMATE_TANH: tl.constexpr):
    # z: fp32 tile -> gelu(z), fp32
    if APPROXIMATE_TANH:
        t = _tanh(z * _SQRT_2_OVER_PI * (1.0 + z * z * _TANH_COEF))
        y = 0.5 * z * (1.0 + t)
    else:
        y = 0.5 * z * (1.0 + tl.math.erf(z * _SQRT1_2))
    return y


@triton.jit
def gelu_grad_tile(z, APPROXIMATE_TANH: tl.constexpr):
    # z: fp32 tile -> d gelu(z) / dz, fp32
    if APPROXIMATE_TANH:
        z2 = z * z
        t = _tanh(z * _SQRT_2_OVER_PI * (1.0 + z2 * _TANH_COEF))
        g = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + z2 * (3.0 * _TANH_COEF))
    else:
        # Phi(z) + z phi(z)
        g = 0.5 * (1.0 + tl.math.erf(z * _SQRT1_2)) + z * tl.exp(-0.5 * z * z) * _INV_SQRT_2PI
    return g


@triton.jit
def row_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # this program's tile of an [M, N] problem on a grid of row tiles x column tiles: its first row
    # (int64), its rows relative to that, its columns, which of them are in bounds, and which of
    # its elements
    row_start = tl.program_id(0).to(tl.int64) * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    return row_start, rows, cols, col_mask, (rows < M - row_start)[:, None] & col_mask[None, :]


@triton.jit
def _bias_gelu_fwd_kernel(
    Y, stride_ym,  # [M, N] out, x.dtype: gelu(x + bias)
    X, stride_xm,  # [M, N] x.dtype
    BIAS,  # [N] contiguous, x.dtype or fp32
    M, N,  # rows, cols
    APPROXIMATE_TANH: tl.constexpr,  # tanh approximation instead of the exact erf form
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # cols per program (grid axis 1 tiles N)
):
    row_start, rows, cols, col_mask, mask = row_tile(M, N, BLOCK_M, BLOCK_N)
    X += row_start * stride_xm
    Y += row_start * stride_ym

    x = tl.load(X + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.).to(tl.float32)
    b = tl.load(BIAS + cols, mask=col_mask, other=0.).to(tl.float32)
    y = gelu_tile(x + b[None, :], APPROXIMATE_TANH)
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bias_gelu_bwd_kernel(
    DX, stride_dxm,  # [M, N] out, x.dtype: dy * gelu'(x + bias)
    DBIAS_PARTIAL, stride_pm,  # [P, N] out, fp32: row p = sum of dx over program p's rows
    DY, stride_dym,  # [M, N] x.dtype
    X, stride_xm,  # [M, N] x.dtype
    BIAS,  # [N] contiguous, x.dtype or fp32
    M, N,  # rows, cols
    rows_per_program,  # rows of one program along grid axis 0, a multiple of BLOCK_M
    APPROXIMATE_TANH: tl.constexpr,  # tanh approximation instead of the exact erf form
    BLOCK_M: tl.constexpr,  # rows per loop step
    BLOCK_N: tl.constexpr,  # cols per program (grid axis 1 tiles N)
):
    pid_m = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)  # relative to the step's first row
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    first_row = pid_m * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, M)

    b = tl.load(BIAS + cols, mask=col_mask, other=0.).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for row_start in range(first_row, last_row, BLOCK_M):  # int64 row index, pointers rebuilt per step
        mask = (rows < last_row - row_start)[:, None] & col_mask[None, :]
        x = tl.load(X + row_start * stride_xm + rows[:, None] * stride_xm + cols[None, :],
                    mask=mask, other=0.).to(tl.float32)
        dy = tl.load(DY + row_start * stride_dym + rows[:, None] * stride_dym + cols[None, :],
                     mask=mask, other=0.).to(tl.float32)
        dx = dy * gelu_grad_tile(x + b[None, :], APPROXIMATE_TANH)  # 0 on masked lanes (dy = 0)
        tl.store(DX + row_start * stride_dxm + rows[:, None] * stride_dxm + cols[None, :],
                 dx.to(DX.dtype.element_ty), mask=mask)
        acc += dx
    tl.store(DBIAS_PARTIAL + pid_m * stride_pm + cols, tl.sum(acc, axis=0), mask=col_mask)


# --------------------------------------------------------------------------------------------
# Launch settings: one table, used by the launchers and by report_configs alike.


_MIN_BLOCK_N = 64  # narrower rows are padded (masked) to 64 lanes
_MAX_BLOCK_N = 256  # divides every BERT width (768, 1024, 3072, 4096): no masked column tiles
_FWD_TILE = 4096  # elements per program in the forward: 16 per thread at 8 warps
_BWD_TILE = 2048  # elements per loop step in the backward: 8 per thread per live tile at 8 warps
_PROGRAMS_PER_SM = 4  # backward grid size, in programs per SM (rows x column tiles)


def settings(n_cols: int, backward: bool = False) -> Settings:
    """Tile shape and launch options for a [*, n_cols] problem (any n_cols >= 1)."""
    block_n = min(max(next_power_of_2(n_cols), _MIN_BLOCK_N), _MAX_BLOCK_N)
    block_m = (_BWD_TILE if backward else _FWD_TILE) // block_n
    return Settings(block_m=block_m, block_n=block_n, num_warps=8, num_stages=1)


def _approximate_tanh(approximate: str) -> bool:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"fastbert: bias_gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate == "tanh"


# --------------------------------------------------------------------------------------------
# Launchers


def launch_tiles(kernel, M: int, N: int, approximate: str, *args, backward: bool = False, **flags) -> None:
    """Launch an elementwise GELU kernel over [M, N] on a grid of row tiles x column tiles (the
    settings of N): its tensor arguments, then M, N, the GELU form, the tile shape and any other
    constexpr flags the kernel takes."""
    tanh = _approximate_tanh(approximate)  # checked, empty or not
    if M == 0 or N == 0:
        return
    s = settings(N, backward)
    launch(kernel, (cdiv(M, s.block_m), cdiv(N, s.block_n)), (*args, M, N),
           dict(APPROXIMATE_TANH=tanh, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **flags, **s.options()))


class BoundTiles:
    """launch_tiles(kernel, M, N, approximate, *args, **flags) bound once (kernels.Bound) for N, the
    GELU form and the flags: a call gives M and the tensor arguments (with their row strides) in the
    kernel's order and launches, none of launch_tiles' settings and options made again; the same
    launch, so the same bits. For a model's inference layers (the GELU over its bias, a gated unit),
    where every launch of a forward has the same N."""

    __slots__ = ("_bound", "_block_m", "_grid_n")

    def __init__(self, kernel, n_args: int, N: int, approximate: str, **flags) -> None:
        s = settings(N)
        names = kernel.arg_names
        self._bound = Bound(kernel, (None,) * (n_args + 1) + (N,),
                            dict(APPROXIMATE_TANH=_approximate_tanh(approximate), BLOCK_M=s.block_m,
                                 BLOCK_N=s.block_n, **flags, **s.options()),
                            names[:n_args + 1])
        self._block_m, self._grid_n = s.block_m, cdiv(N, s.block_n)

    def __call__(self, M: int, *args) -> None:
        if M > 0:
            self._bound.run((cdiv(M, self._block_m), self._grid_n), *args, M)


_INFERENCE_GELUS: dict = {}  # (N, approximate) -> its BoundTiles


def bias_gelu_inference(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
    """bias_gelu_forward(x, bias, approximate, out=x), a model's inference layers' GELU written over
    x, its launch bound once per N and form (BoundTiles: no tensor held). x [M, N] rows of unit
    column stride. -> x."""
    M, N = x.shape
    tiles = _INFERENCE_GELUS.get((N, approximate))
    if tiles is None:
        tiles = _INFERENCE_GELUS[N, approximate] = BoundTiles(_bias_gelu_fwd_kernel, 5, N, approximate)
    step = x.stride(0)
    tiles(M, x, step, x, step, bias)
    return x


def bias_gelu_forward(x: torch.Tensor, bias: torch.Tensor, approximate: str, *,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = gelu(x + bias): x [M, N] fp32/fp16/bf16, bias [N] x.dtype or fp32 -> y [M, N] x.dtype.
    out: where y goes ([M, N] in x.dtype, rows with unit stride; x itself allowed, for inference
    where x dies here: each element is read before it is written, by the same program)."""
    y = torch.empty_like(x) if out is None else out
    launch_tiles(_bias_gelu_fwd_kernel, *x.shape, approximate, y, y.stride(0), x, x.stride(0), bias)
    return y


def _backward_grid(M: int, N: int, device) -> Tuple[Settings, int, int, int]:
    # the backward's (settings, column tiles, rows per program, programs along the rows)
    s = settings(N, backward=True)
    n_col_tiles = cdiv(N, s.block_n)
    return (s, n_col_tiles, *split_rows(M, s.block_m, cdiv(_PROGRAMS_PER_SM * num_sms(device), n_col_tiles)))


def backward_partials_shape(M: int, N: int, device) -> Tuple[int, int]:
    """The shape of bias_gelu_backward's partial sums of dbias for [M, N] (M, N >= 1), fp32: what
    its `partials` takes, for a caller that allocates a step's tensors at once (kernels.empty_parts)."""
    return (_backward_grid(M, N, device)[3], N)


def bias_gelu_backward(
    dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str, *,
    out: Optional[torch.Tensor] = None, partials: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dx, dbias): dx = dy * gelu'(x + bias) [M, N] in x.dtype, dbias = sum_rows(dx) [N] in bias.dtype.
    For a caller that allocates a step's tensors at once (kernels.empty_parts): out, where dx goes
    ([M, N] in x.dtype, rows with unit stride); partials, the partial sums' memory
    (backward_partials_shape)."""
    tanh = _approximate_tanh(approximate)
    M, N = x.shape
    dx = torch.empty_like(x) if out is None else out
    if M == 0 or N == 0:
        return dx, torch.zeros_like(bias)
    s, n_col_tiles, rows_per_program, n_row_programs = _backward_grid(M, N, x.device)
    partials = fresh_or_given(partials, (n_row_programs, N), torch.float32, x.device, "bias_gelu_backward's partials",
                              unit_columns=True)
    launch(_bias_gelu_bwd_kernel, (n_row_programs, n_col_tiles),
           (dx, dx.stride(0), partials, partials.stride(0), dy, dy.stride(0), x, x.stride(0), bias, M, N,
            rows_per_program),
           dict(APPROXIMATE_TANH=tanh, BLOCK_M=s.block_m, BLOCK_N=s.block_n, **s.options()))
    return dx, partials.sum(0).to(bias.dtype)


# --------------------------------------------------------------------------------------------
# Build report: every variant the launchers above can compile.

_X_DTYPES = ("fp32", "fp16", "bf16")


def report_configs(max_cols: int = 8192) -> Iterator[KernelBuild]:
    """Every (kernel, settings, dtypes, flags) the launchers can pick for N in 1..max_cols."""
    fwd = sorted({settings(n) for n in range(1, max_cols + 1)})
    bwd = sorted({settings(n, backward=True) for n in range(1, max_cols + 1)})
    for x_dt in _X_DTYPES:
        for b_dt in dict.fromkeys((x_dt, "fp32")):
            for approximate in ("none", "tanh"):
                flags = {"APPROXIMATE_TANH": approximate == "tanh"}
                for s in fwd:
                    sig = {"Y": f"*{x_dt}", "stride_ym": "i32", "X": f"*{x_dt}", "stride_xm": "i32",
                           "BIAS": f"*{b_dt}", "M": "i32", "N": "i32"}
                    yield from _builds("bias_gelu_fwd", _bias_gelu_fwd_kernel, sig, flags, s, x_dt, b_dt, approximate)
                for s in bwd:
                    sig = {"DX": f"*{x_dt}", "stride_dxm": "i32", "DBIAS_PARTIAL": "*fp32", "stride_pm": "i32",
                           "DY": f"*{x_dt}", "stride_dym": "i32", "X": f"*{x_dt}", "stride_xm": "i32",
                           "BIAS": f"*{b_dt}", "M": "i32", "N": "i32", "rows_per_program": "i32"}
                    yield from _builds("bias_gelu_bwd", _bias_gelu_bwd_kernel, sig, flags, s, x_dt, b_dt, approximate)


def _builds(name, fn, sig, flags, s: Settings, x_dt, b_dt, approximate) -> Iterator[KernelBuild]:
    constexprs = dict(flags, BLOCK_M=s.block_m, BLOCK_N=s.block_n)
    # N % 16 == 0 (pointers, strides and N divisible by 16) is only possible when BLOCK_N >= 16
    for aligned in (True, False) if s.block_n >= 16 else (False,):
        config = {"x": x_dt, "bias": b_dt, "approximate": approximate,
                  "BLOCK_M": s.block_m, "BLOCK_N": s.block_n, "aligned": aligned}
        yield KernelBuild(name, fn, sig, constexprs, s.num_warps, s.num_stages, config,
                          aligned_args(sig) if aligned else ())
