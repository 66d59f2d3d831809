"""Gated linear units over the last dim: y = act(a) * b with a, b = x[:, :N], x[:, N:], forward and
backward; act is GELU (GeGLU: ModernBERT, GTE) or SiLU (SwiGLU: NomicBERT, EuroBERT).

A gated feed-forward, between its two GEMMs: the first GEMM's output [M, 2N] is read once, and
neither half is copied. Layout of this file: jit kernels, the launchers `geglu_forward` /
`geglu_backward` (plain Python; inputs arrive validated, 2-D, contiguous, on one device), then
`report_configs`. The GELU forms (and the tile shapes) are bias_gelu's. Everything is computed in
fp32; y and dx are stored in x.dtype.
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch
import triton
import triton.language as tl

from . import KernelBuild, Settings, aligned_args
from .bias_gelu import BoundTiles, gelu_grad_tile, gelu_tile, launch_tiles, row_tile, settings


@triton.jit
def _sigmoid(a):
    # 1 / (1 + exp(-a)), its division the fast form: IEEE division's slow path spilled on sm_80; exp(-a)
    # overflows to inf for a < -88, where the quotient is 0 (silu(a) below 1e-36)
    return tl.fdiv(tl.full(a.shape, 1.0, tl.float32), 1.0 + tl.exp(-a), ieee_rounding=False)


@triton.jit
def _gate_tile(a, APPROXIMATE_TANH: tl.constexpr, SILU: tl.constexpr):
    # a: fp32 tile -> (act(a), act'(a)) in fp32; SiLU: a s, s + a s (1 - s) with s = sigmoid(a)
    if SILU:
        s = _sigmoid(a)
        return a * s, s + a * s * (1.0 - s)
    return gelu_tile(a, APPROXIMATE_TANH), gelu_grad_tile(a, APPROXIMATE_TANH)


@triton.jit
def _geglu_fwd_kernel(
    Y, stride_ym,  # [M, N] out, x.dtype: act(a) * b
    X, stride_xm,  # [M, 2N] x.dtype: a = X[:, :N], b = X[:, N:]
    M, N,  # rows, cols of Y
    APPROXIMATE_TANH: tl.constexpr,  # GELU's tanh approximation instead of the exact erf form
    SILU: tl.constexpr,  # act is SiLU (SwiGLU), not GELU
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # cols per program (grid axis 1 tiles N)
):
    row_start, rows, cols, _, mask = row_tile(M, N, BLOCK_M, BLOCK_N)
    A = X + row_start * stride_xm + rows[:, None] * stride_xm + cols[None, :]
    a = tl.load(A, mask=mask, other=0.).to(tl.float32)
    b = tl.load(A + N, mask=mask, other=0.).to(tl.float32)
    if SILU:
        y = tl.fdiv(a * b, 1.0 + tl.exp(-a), ieee_rounding=False)  # a b sigmoid(a) (see _sigmoid)
    else:
        y = gelu_tile(a, APPROXIMATE_TANH) * b
    tl.store(Y + row_start * stride_ym + rows[:, None] * stride_ym + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd_kernel(
    DX, stride_dxm,  # [M, 2N] out, x.dtype: (dy * b * act'(a), dy * act(a))
    DY, stride_dym,  # [M, N] x.dtype
    X, stride_xm,  # [M, 2N] x.dtype
    M, N,  # rows, cols of DY
    APPROXIMATE_TANH: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row_start, rows, cols, _, mask = row_tile(M, N, BLOCK_M, BLOCK_N)
    A = X + row_start * stride_xm + rows[:, None] * stride_xm + cols[None, :]
    a = tl.load(A, mask=mask, other=0.).to(tl.float32)
    b = tl.load(A + N, mask=mask, other=0.).to(tl.float32)
    dy = tl.load(DY + row_start * stride_dym + rows[:, None] * stride_dym + cols[None, :], mask=mask,
                 other=0.).to(tl.float32)
    act, act_grad = _gate_tile(a, APPROXIMATE_TANH, SILU)
    DA = DX + row_start * stride_dxm + rows[:, None] * stride_dxm + cols[None, :]
    tl.store(DA, (dy * b * act_grad).to(DX.dtype.element_ty), mask=mask)
    tl.store(DA + N, (dy * act).to(DX.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers


def _gelu_form(approximate: str) -> str:
    # the launchers' `approximate`: GELU's forms ("none", "tanh") or "silu"; launch_tiles takes GELU's
    return "none" if approximate == "silu" else approximate


def geglu_forward(x: torch.Tensor, approximate: str, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = act(x[:, :N]) * x[:, N:]: x [M, 2N] fp32/fp16/bf16 -> y [M, N] x.dtype. approximate: the
    gate's activation, GELU's "none" (erf) or "tanh", or "silu" (SwiGLU). out: where y goes ([M, N]
    in x.dtype, rows with unit stride), for a caller that allocates a step's tensors at once."""
    M, N = x.shape[0], x.shape[1] // 2
    y = torch.empty((M, N), dtype=x.dtype, device=x.device) if out is None else out
    launch_tiles(_geglu_fwd_kernel, M, N, _gelu_form(approximate), y, y.stride(0), x, x.stride(0),
                 SILU=approximate == "silu")
    return y


_INFERENCE: dict = {}  # (N, approximate) -> its BoundTiles


def geglu_inference(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """geglu_forward(x, approximate), a model's inference layers' gated unit, its launch bound once
    per N and form (BoundTiles: no tensor held). -> y [M, N], fresh."""
    M, N = x.shape[0], x.shape[1] // 2
    tiles = _INFERENCE.get((N, approximate))
    if tiles is None:
        tiles = _INFERENCE[N, approximate] = BoundTiles(_geglu_fwd_kernel, 4, N, _gelu_form(approximate),
                                                        SILU=approximate == "silu")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    tiles(M, y, y.stride(0), x, x.stride(0))
    return y


def geglu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str, *,
                   out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dx [M, 2N] in x.dtype: dy * x[:, N:] * act'(x[:, :N]), then dy * act(x[:, :N]); approximate as
    geglu_forward's. out: where dx goes ([M, 2N] in x.dtype, rows with unit stride), for a caller
    that allocates a step's tensors at once."""
    dx = torch.empty_like(x) if out is None else out
    launch_tiles(_geglu_bwd_kernel, *dy.shape, _gelu_form(approximate), dx, dx.stride(0), dy, dy.stride(0), x,
                 x.stride(0), backward=True, SILU=approximate == "silu")
    return dx


# --------------------------------------------------------------------------------------------
# Build report: every variant the launchers above can compile.


def report_configs(max_cols: int = 8192) -> Iterator[KernelBuild]:
    """Every (kernel, settings, dtype, activation) the launchers can pick for N in 1..max_cols."""
    fwd = sorted({settings(n) for n in range(1, max_cols + 1)})
    bwd = sorted({settings(n, backward=True) for n in range(1, max_cols + 1)})
    for x_dt in ("fp32", "fp16", "bf16"):
        for approximate in ("none", "tanh", "silu"):
            flags = {"APPROXIMATE_TANH": approximate == "tanh", "SILU": approximate == "silu"}
            sig = {"Y": f"*{x_dt}", "stride_ym": "i32", "X": f"*{x_dt}", "stride_xm": "i32", "M": "i32", "N": "i32"}
            for s in fwd:
                yield from _builds("geglu_fwd", _geglu_fwd_kernel, sig, flags, s, x_dt, approximate)
            sig = {"DX": f"*{x_dt}", "stride_dxm": "i32", "DY": f"*{x_dt}", "stride_dym": "i32", "X": f"*{x_dt}",
                   "stride_xm": "i32", "M": "i32", "N": "i32"}
            for s in bwd:
                yield from _builds("geglu_bwd", _geglu_bwd_kernel, sig, flags, s, x_dt, approximate)


def _builds(name, fn, sig, flags, s: Settings, x_dt, approximate) -> Iterator[KernelBuild]:
    constexprs = dict(flags, BLOCK_M=s.block_m, BLOCK_N=s.block_n)
    for aligned in (True, False) if s.block_n >= 16 else (False,):
        config = {"x": x_dt, "approximate": approximate, "BLOCK_M": s.block_m, "BLOCK_N": s.block_n, "aligned": aligned}
        yield KernelBuild(name, fn, sig, constexprs, s.num_warps, s.num_stages, config,
                          aligned_args(sig) if aligned else ())
