"""Fused dropout + residual add + LayerNorm (or RMSNorm) over the last dim, forward and backward.

BERT's residual tail (BertSelfOutput / BertOutput): y = layer_norm(dropout(x) + residual); with
RMS, a Llama-style encoder's (EuroBERT's) y = rms_norm(dropout(x) + residual), the same kernels with
the mean taken as 0 (stored as 0, so the backward's xhat = h * rstd) and no mean(g) term.
Layout of this file: jit kernels, the launchers `add_layer_norm_forward` /
`add_layer_norm_backward` (plain Python; inputs arrive validated, 2-D, contiguous, on one
device), then `report_configs`; the launch settings table is in `layer_norm_settings`.

The forward reads x and residual once and writes y once: h = dropout(x) + residual lives only in
registers (HAS_SUM: h is written out too, a pre-LN model's residual stream). The backward
recomputes h from x, residual and the regenerated dropout mask:
    xhat = (h - mean) * rstd, g = dy * weight,
    dh = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ dsum, HAS_DSUM: the gradient of h itself),
    (RMS: dh = rstd * (g - xhat * mean(g * xhat)): the mean is no function of h there)
    dresidual = dh, dx = dh * keep / (1 - p), dweight = sum_rows(dy * xhat), dbias = sum_rows(dy).
Rows up to 4096 wide (2048 with dsum) are done whole, one per loop step, in one kernel; wider
rows take two column-chunked passes (row sums, then column tiles), so no thread ever holds a
row's worth of state that would spill. Statistics (mean, rstd) and the partial dweight / dbias sums are fp32;
dweight and dbias are reduced without atomics (per-program partials, then a fixed-order sum),
so they are deterministic.

Dropout follows the rule of fastbert.reference, bit for bit: element (r, c) has counter
offset = r * N + c (int64), u = tl.randint(seed, offset), and is kept when
(u >> 8) >= floor(p * 2**24); kept values are scaled by 1 / (1 - p).
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch
import triton
import triton.language as tl

from . import (
    Bound,
    KernelBuild,
    Settings,
    aligned_args,
    apart,
    cdiv,
    dropout_options,
    empty_together,
    fresh_or_given,
    launch,
    num_sms,
    sink,
    split_rows,
)
from .layer_norm_settings import (
    MAX_N,
    PROGRAMS_PER_SM,
    ROW_SUMS_SETTINGS,
    TILED_SETTINGS,
    optional_rows,
    optional_rows_args,
    settings,
)


@triton.jit
def _keep_mask(offsets, seed, threshold):
    # offsets: int64 tile of r * N + c -> bool tile: dropout keeps the element
    return (tl.randint(seed, offsets) >> 8) >= threshold


@triton.jit
def _add_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit(do_not_specialize=["seed", "threshold"])
def _add_layer_norm_fwd_kernel(
    Y, stride_ym,  # [M, N] out, x.dtype: layer_norm(h), h = dropout(x) + residual
    S, stride_sm,  # [M, N] out, x.dtype: h itself with HAS_SUM (a pre-LN model's residual stream), else None
    MEAN, RSTD,  # [M] out, fp32, contiguous: statistics of h, for the backward
    X, stride_xm,  # [M, N] x.dtype
    RES, stride_rm,  # [M, N] x.dtype: residual
    W, B,  # [N] contiguous, x.dtype or fp32: LayerNorm weight and bias (B unread without HAS_BIAS)
    M, N,  # rows, cols
    eps,  # fp32
    seed,  # dropout seed in [0, 2**63), unused without HAS_DROPOUT
    threshold,  # i32: an element is dropped when (u >> 8) < threshold
    scale,  # fp32: 1 / (1 - p), the scale of kept elements
    HAS_DROPOUT: tl.constexpr,  # apply dropout to x (no RNG code is compiled without it)
    HAS_BIAS: tl.constexpr,  # add B (a LayerNorm without bias has none)
    HAS_SUM: tl.constexpr,  # write h to S
    RMS: tl.constexpr,  # RMSNorm: no mean subtracted (MEAN stores 0), rstd = 1 / sqrt(mean(h^2) + eps)
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # >= N, a power of 2: a whole row per program
):
    row_start = tl.program_id(0).to(tl.int64) * BLOCK_M
    rows = tl.arange(0, BLOCK_M)  # relative to row_start
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M - row_start
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    X += row_start * stride_xm
    RES += row_start * stride_rm
    Y += row_start * stride_ym

    x = tl.load(X + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.).to(tl.float32)
    res = tl.load(RES + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.).to(tl.float32)
    if HAS_DROPOUT:
        offsets = row_start * N + (rows[:, None] * N + cols[None, :])  # int64: r * N + c
        x = tl.where(_keep_mask(offsets, seed, threshold), x * scale, 0.)
    h = x + res  # 0 on masked lanes
    if HAS_SUM:
        tl.store(S + (row_start + rows[:, None]) * stride_sm + cols[None, :], h.to(S.dtype.element_ty), mask=mask)
    if RMS:
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        diff = h  # 0 on masked lanes
    else:
        mean = tl.sum(h, axis=1) / N
        diff = tl.where(mask, h - mean[:, None], 0.)  # masked lanes must not enter the variance
    var = tl.sum(diff * diff, axis=1) / N
    rstd = tl.math.rsqrt(var + eps)
    w = tl.load(W + cols, mask=col_mask, other=0.).to(tl.float32)
    y = diff * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(B + cols, mask=col_mask, other=0.).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row_start + rows, mean, mask=row_mask)
    tl.store(RSTD + row_start + rows, rstd, mask=row_mask)


@triton.jit
def _bwd_xhat(X_row, RES_row, DY_row, MEAN_row, RSTD_row, offsets, cols, mask,
              seed, threshold, scale, HAS_DROPOUT: tl.constexpr):
    # One row's (or column chunk's) xhat = (dropout(x) + residual - mean) * rstd, dy and keep
    # mask, fp32, 0 on masked lanes. offsets: the int64 dropout counters r * N + c.
    if HAS_DROPOUT:
        # dropped elements of x are not read: the load waits for the mask, so the RNG state
        # and the loaded tile are not live at the same time
        keep = _keep_mask(offsets, seed, threshold)
        x = tl.load(X_row + cols, mask=mask & keep, other=0.).to(tl.float32) * scale
    else:
        keep = mask
        x = tl.load(X_row + cols, mask=mask, other=0.).to(tl.float32)
    res = tl.load(RES_row + cols, mask=mask, other=0.).to(tl.float32)
    xhat = tl.where(mask, (x + res - tl.load(MEAN_row)) * tl.load(RSTD_row), 0.)
    dy = tl.load(DY_row + cols, mask=mask, other=0.).to(tl.float32)
    return xhat, dy, keep


@triton.jit
def _bwd_store(DX_row, DRES_row, dh, keep, cols, mask, scale, HAS_DROPOUT: tl.constexpr):
    # dresidual = dh; dx = dh * keep / (1 - p). Masked lanes of dh hold -rstd * mean(g): never
    # stored, zeroed so that no cast overflows (rstd = 1 / sqrt(eps) when N = 1)
    dh = tl.where(mask, dh, 0.)
    tl.store(DRES_row + cols, dh.to(DRES_row.dtype.element_ty), mask=mask)
    if HAS_DROPOUT:
        dh = tl.where(keep, dh * scale, 0.)
    tl.store(DX_row + cols, dh.to(DX_row.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["seed", "threshold"])
def _add_layer_norm_bwd_row_sums_kernel(
    MEAN_G, MEAN_GX,  # [M] out, fp32: row means of g = dy * weight and of g * xhat
    DY, stride_dym,  # [M, N] x.dtype: grad of y
    X, stride_xm,  # [M, N] x.dtype
    RES, stride_rm,  # [M, N] x.dtype: residual
    W,  # [N] contiguous, x.dtype or fp32: LayerNorm weight
    MEAN, RSTD,  # [M] contiguous, fp32: from the forward
    M, N,  # rows, cols
    seed,  # dropout seed of the forward, unused without HAS_DROPOUT
    threshold,  # i32: an element is dropped when (u >> 8) < threshold
    scale,  # fp32: 1 / (1 - p)
    HAS_DROPOUT: tl.constexpr,  # the forward applied dropout to x
    BLOCK_N: tl.constexpr,  # column chunk per loop step
):
    # Wide rows, pass 1 of 2: one program per row walks it in column chunks and reduces the two
    # row sums of the LayerNorm backward, so no whole row is ever held in registers.
    row = tl.program_id(0).to(tl.int64)
    acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_gx = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        xhat, dy, _ = _bwd_xhat(X + row * stride_xm, RES + row * stride_rm, DY + row * stride_dym,
                                MEAN + row, RSTD + row, row * N + cols, cols, mask,
                                seed, threshold, scale, HAS_DROPOUT)
        g = dy * tl.load(W + cols, mask=mask, other=0.).to(tl.float32)
        acc_g += g
        acc_gx += g * xhat
    sum_g, sum_gx = tl.reduce((acc_g, acc_gx), 0, _add_pair)
    tl.store(MEAN_G + row, sum_g / N)
    tl.store(MEAN_GX + row, sum_gx / N)


@triton.jit(do_not_specialize=["seed", "threshold"])
def _add_layer_norm_bwd_kernel(
    DX, stride_dxm,  # [M, N] out, x.dtype: grad of x
    DRES, stride_drm,  # [M, N] out, x.dtype: grad of residual (= grad of h)
    DW_PARTIAL, DB_PARTIAL, stride_pm,  # [P, N] out, fp32: row p = program p's sums of dy * xhat, dy
    DY, stride_dym,  # [M, N] x.dtype: grad of y
    DSUM, stride_dsm,  # [M, N] x.dtype: grad of h itself (the forward's S) with HAS_DSUM, else None
    X, stride_xm,  # [M, N] x.dtype
    RES, stride_rm,  # [M, N] x.dtype: residual
    W,  # [N] contiguous, x.dtype or fp32: LayerNorm weight
    MEAN, RSTD,  # [M] contiguous, fp32: from the forward
    MEAN_G, MEAN_GX,  # [M] contiguous, fp32: from _add_layer_norm_bwd_row_sums_kernel (TWO_PASS), else None
    M, N,  # rows, cols
    rows_per_program,  # consecutive rows of one program along grid axis 0
    seed,  # dropout seed of the forward, unused without HAS_DROPOUT
    threshold,  # i32: an element is dropped when (u >> 8) < threshold
    scale,  # fp32: 1 / (1 - p)
    HAS_DROPOUT: tl.constexpr,  # the forward applied dropout to x
    HAS_DSUM: tl.constexpr,  # add DSUM to the gradient of h
    TWO_PASS: tl.constexpr,  # the row means of g and g * xhat come from pass 1 (MEAN_G, MEAN_GX)
    RMS: tl.constexpr,  # the forward was an RMSNorm (MEAN holds 0): no mean(g) term
    BLOCK_N: tl.constexpr,  # cols per program: a whole row (>= N, a power of 2), or a tile of one (TWO_PASS)
):
    # One row at a time; dweight / dbias partials accumulate over the program's rows. A whole row
    # in registers reduces its own two row means; a wide row (TWO_PASS, pass 2 of 2) is tiled
    # along grid axis 1 and reads them. Only the int64 row index is carried across steps
    # (pointers are rebuilt from it), which keeps fewer registers live than carried 64-bit pointers.
    pid_m = tl.program_id(0).to(tl.int64)
    if TWO_PASS:
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    else:  # the whole row: no column offset to carry
        cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    first_row = pid_m * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, M)

    w = tl.load(W + cols, mask=mask, other=0.).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for row in range(first_row, last_row):
        xhat, dy, keep = _bwd_xhat(X + row * stride_xm, RES + row * stride_rm, DY + row * stride_dym,
                                   MEAN + row, RSTD + row, row * N + cols, cols, mask,
                                   seed, threshold, scale, HAS_DROPOUT)
        dw_acc += dy * xhat
        db_acc += dy
        g = dy * w  # 0 on masked lanes
        if TWO_PASS:
            mean_g = tl.load(MEAN_G + row)
            mean_gx = tl.load(MEAN_GX + row)
        else:
            sum_g, sum_gx = tl.reduce((g, g * xhat), 0, _add_pair)  # one pass for both row sums
            mean_g = sum_g / N
            mean_gx = sum_gx / N
        if RMS:
            dh = tl.load(RSTD + row) * (g - xhat * mean_gx)
        else:
            dh = tl.load(RSTD + row) * (g - mean_g - xhat * mean_gx)
        if HAS_DSUM:
            dh += tl.load(DSUM + row * stride_dsm + cols, mask=mask, other=0.).to(tl.float32)
        _bwd_store(DX + row * stride_dxm, DRES + row * stride_drm, dh, keep, cols, mask, scale, HAS_DROPOUT)
    tl.store(DW_PARTIAL + pid_m * stride_pm + cols, dw_acc, mask=mask)
    tl.store(DB_PARTIAL + pid_m * stride_pm + cols, db_acc, mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers


def add_layer_norm_forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                           eps: float, dropout_p: float, seed: Optional[int], return_sum: bool = False, *,
                           rms: bool = False, out: Optional[torch.Tensor] = None, sum_out: Optional[torch.Tensor] = None,
                           stats: bool = True, stats_out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """(y, mean, rstd): y = layer_norm(h) [M, N] in x.dtype, h = dropout(x) + residual; mean, rstd [M] fp32.
    return_sum: (y, mean, rstd, h), h [M, N] in x.dtype, written in the same pass.

    x, residual [M, N] fp32/fp16/bf16 (same dtype); weight, bias [N] in x.dtype or fp32 (bias None: none);
    seed: a Python int in [0, 2**63), used when dropout_p > 0. rms: an RMSNorm (bias None; mean
    returned as 0).
    For inference, where x and residual may die here: out, sum_out: where y and h go ([M, N] in
    x.dtype, rows with unit stride; x or residual themselves allowed: a program reads its rows whole
    before it writes them); stats False: mean and rstd are not kept (returned as None). stats_out:
    (mean, rstd) to write them into (fp32 [M], contiguous), for a caller that allocates a step's
    tensors at once (kernels.empty_parts).
    """
    M, N = x.shape
    y = torch.empty_like(x) if out is None else out
    h = (torch.empty_like(x) if sum_out is None else sum_out) if return_sum else None
    if stats_out is not None:
        mean, rstd = stats_out
    elif stats:
        mean, rstd = empty_together(2, (M,), torch.float32, x.device)
    else:  # both into the sink: nobody reads either
        mean = rstd = sink(M, x.device)
    if M > 0:
        s = settings(N, with_sum=return_sum)
        has_dropout, seed, threshold, scale = dropout_options(dropout_p, seed, "add_layer_norm")
        launch(_add_layer_norm_fwd_kernel, (cdiv(M, s.block_m),),
               (y, y.stride(0), *optional_rows(h), mean, rstd, x, x.stride(0), residual, residual.stride(0),
                weight, weight if bias is None else bias, M, N, eps, seed, threshold, scale),
               dict(HAS_DROPOUT=has_dropout, HAS_BIAS=bias is not None, HAS_SUM=return_sum, RMS=rms,
                    BLOCK_M=s.block_m, BLOCK_N=s.block_n, **s.options()))
    if not stats:
        mean = rstd = None
    return (y, mean, rstd, h) if return_sum else (y, mean, rstd)


def add_layer_norm_inference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             bias: Optional[torch.Tensor], eps: float, *, rms: bool = False, return_sum: bool = False,
                             sum_out: Optional[torch.Tensor] = None):
    """add_layer_norm_forward(x, residual, weight, bias, eps, 0.0, None, return_sum, rms=rms, out=x,
    sum_out=sum_out, stats=False): a model's inference layers' add + norm written over x, no
    dropout, no statistics kept, its launch bound once (kernels.Bound) per N, bias or none, norm
    and sum flags (the Bound holds no tensor: one serves every dtype and device, its direct
    launches keyed on them): a call is its launch and its own values, none of the launcher's
    settings, options and stand-ins made again. The same kernel on the same arguments, so the same
    bits. x, residual, sum_out: [M, N] rows of unit column stride, x.dtype (sum_out: residual itself
    allowed); weight, bias [N] contiguous, x.dtype or fp32. -> y (x), and h with return_sum."""
    M, N = x.shape
    key = (N, bias is not None, rms, return_sum)
    bound = _INFERENCE_NORMS.get(key)
    if bound is None:
        bound = _INFERENCE_NORMS[key] = _bind_inference_norm(*key)
    h = (torch.empty_like(x) if sum_out is None else sum_out) if return_sum else None
    if M > 0:
        stats = sink(M, x.device)
        step = x.stride(0)
        values = (x, step, stats, stats, x, step, residual, residual.stride(0), weight,
                  weight if bias is None else bias, M, eps)
        if return_sum:
            values += (h, h.stride(0))
        bound[0].run((cdiv(M, bound[1]),), *values)
    return (x, h) if return_sum else x


_INFERENCE_NORMS: dict = {}  # (N, has_bias, rms, with_sum) -> (its Bound, the tile's rows)


def _bind_inference_norm(N: int, has_bias: bool, rms: bool, with_sum: bool) -> Tuple[Bound, int]:
    s = settings(N, with_sum=with_sum)
    varying = ("Y", "stride_ym", "MEAN", "RSTD", "X", "stride_xm", "RES", "stride_rm", "W", "B", "M", "eps")
    if with_sum:
        varying += ("S", "stride_sm")
    off = dropout_options(0.0, None, "add_layer_norm")
    args = (None,) * 13 + (N, None, off.seed, off.threshold, off.scale)  # Y .. M, then N, eps, the dropout's
    options = dict(HAS_DROPOUT=False, HAS_BIAS=has_bias, HAS_SUM=with_sum, RMS=rms, BLOCK_M=s.block_m,
                   BLOCK_N=s.block_n, **s.options())
    return Bound(_add_layer_norm_fwd_kernel, args, options, varying), s.block_m


def _partial_rows(n_programs: int, N: int) -> int:
    # the partial sums' rows: the programs', padded so that dbias's half starts 16-byte aligned
    padded = n_programs
    while padded * N % 4:
        padded += 1
    return padded


def _partial_sums(n_programs: int, N: int, device, out: Optional[torch.Tensor]) -> torch.Tensor:
    """The per-program partial sums of dweight and dbias the backward kernels write, fp32 [2,
    programs, N] (dweight's, then dbias's: one allocation, one reduction), each half 16-byte
    aligned as a fresh tensor would be; in `out` where given (backward_partials_shape)."""
    padded = _partial_rows(n_programs, N)
    out = fresh_or_given(out, (2, padded, N), torch.float32, device, "add_layer_norm_backward's partials")
    return out if padded == n_programs else out.narrow(1, 0, n_programs)


def _programs(M: int, N: int, s: Optional[Settings], device) -> Tuple[int, int]:
    """(rows_per_program, programs along the rows) of the backward: whole rows (s: their settings)
    or, for wider rows (s None), the column tiles' pass."""
    max_programs = PROGRAMS_PER_SM * num_sms(device)
    if s is None:
        max_programs = cdiv(max_programs, cdiv(N, TILED_SETTINGS.block_n))
    return split_rows(M, 1, max_programs)


def backward_partials_shape(M: int, N: int, device, with_dsum: bool = False) -> Tuple[int, int, int]:
    """The shape of add_layer_norm_backward's partial sums for [M, N] rows (M >= 1; with_dsum: the
    call gives dsum), fp32: what its `partials` takes, for a caller that allocates a step's tensors
    at once (kernels.empty_parts)."""
    _, n_programs = _programs(M, N, settings(N, backward=True, with_sum=with_dsum), device)
    return (2, _partial_rows(n_programs, N), N)


def _backward_whole_rows(dx, dresidual, dy, dsum, x, residual, weight, mean, rstd, s: Settings, has_dropout: bool,
                         dropout_args, partials: Optional[torch.Tensor], rms: bool) -> torch.Tensor:
    """Launch the backward of rows that settings() takes whole (one kernel, whole rows); the
    per-program partial sums of dweight and dbias (_partial_sums)."""
    M, N = x.shape
    rows_per_program, n_programs = _programs(M, N, s, x.device)
    partial = _partial_sums(n_programs, N, x.device, partials)
    launch(_add_layer_norm_bwd_kernel, (n_programs,),
           (dx, dx.stride(0), dresidual, dresidual.stride(0), partial[0], partial[1], partial.stride(1),
            dy, dy.stride(0), *optional_rows(dsum), x, x.stride(0), residual, residual.stride(0), weight, mean, rstd,
            None, None, M, N, rows_per_program, *dropout_args),
           dict(HAS_DROPOUT=has_dropout, HAS_DSUM=dsum is not None, TWO_PASS=False, RMS=rms, BLOCK_N=s.block_n,
                **s.options()))
    return partial


def _backward_two_pass(dx, dresidual, dy, dsum, x, residual, weight, mean, rstd, has_dropout: bool, dropout_args,
                       partials: Optional[torch.Tensor], rms: bool) -> torch.Tensor:
    """Launch the backward of wider rows: row sums, then column tiles; the per-program partial
    sums of dweight and dbias (_partial_sums)."""
    M, N = x.shape
    mean_g, mean_gx = empty_together(2, (M,), torch.float32, x.device)
    grad_y = (dy, dy.stride(0))
    inputs = (x, x.stride(0), residual, residual.stride(0), weight, mean, rstd)
    s = ROW_SUMS_SETTINGS
    launch(_add_layer_norm_bwd_row_sums_kernel, (M,), (mean_g, mean_gx, *grad_y, *inputs, M, N, *dropout_args),
           dict(HAS_DROPOUT=has_dropout, BLOCK_N=s.block_n, **s.options()))
    s = TILED_SETTINGS
    rows_per_program, n_programs = _programs(M, N, None, x.device)
    partial = _partial_sums(n_programs, N, x.device, partials)
    launch(_add_layer_norm_bwd_kernel, (n_programs, cdiv(N, s.block_n)),
           (dx, dx.stride(0), dresidual, dresidual.stride(0), partial[0], partial[1], partial.stride(1),
            *grad_y, *optional_rows(dsum), *inputs, mean_g, mean_gx, M, N, rows_per_program, *dropout_args),
           dict(HAS_DROPOUT=has_dropout, HAS_DSUM=dsum is not None, TWO_PASS=True, RMS=rms, BLOCK_N=s.block_n,
                **s.options()))
    return partial


def add_layer_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dropout_p: float,
    seed: Optional[int],
    dsum: Optional[torch.Tensor] = None,
    *,
    rms: bool = False,
    out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    partials: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dresidual, dweight, dbias) of add_layer_norm_forward; dweight, dbias in weight.dtype.

    dy, x, residual [M, N]; weight [N]; mean, rstd [M] fp32 from the forward; the same
    dropout_p and seed as the forward (the mask is regenerated, not stored). dsum [M, N] (x.dtype,
    contiguous rows): the gradient of return_sum's h, added to h's before it reaches dresidual and dx.
    rms: the forward's (dbias, the row sums of dy, is then of no use to the caller).
    For a caller that allocates a step's tensors at once (kernels.empty_parts): out, (dx,
    dresidual) to write ([M, N] in x.dtype, rows with unit stride); partials, the partial sums'
    memory (backward_partials_shape).
    """
    M, N = x.shape
    dx, dresidual = empty_together(2, (M, N), x.dtype, x.device) if out is None else out
    if M == 0:
        return dx, dresidual, torch.zeros_like(weight), torch.zeros_like(weight)
    has_dropout, seed, threshold, scale = dropout_options(dropout_p, seed, "add_layer_norm")
    dropout_args = (seed, threshold, scale)
    s = settings(N, backward=True, with_sum=dsum is not None)
    args = (dx, dresidual, dy, dsum, x, residual, weight, mean, rstd)
    if s is not None:  # whole rows
        partial = _backward_whole_rows(*args, s, has_dropout, dropout_args, partials, rms)
    else:  # wide rows: row sums, then column tiles
        partial = _backward_two_pass(*args, has_dropout, dropout_args, partials, rms)
    if apart():  # a custom op's outputs: no two may share memory
        return dx, dresidual, partial[0].sum(0).to(weight.dtype), partial[1].sum(0).to(weight.dtype)
    sums = partial.sum(1)  # both reductions in one call
    dw, db = (sums if sums.dtype == weight.dtype else sums.to(weight.dtype)).unbind(0)
    return dx, dresidual, dw, db


# --------------------------------------------------------------------------------------------
# Build report: every variant the launchers above can compile.

_X_DTYPES = ("fp32", "fp16", "bf16")


def report_configs(max_cols: int = MAX_N) -> Iterator[KernelBuild]:
    """Every (kernel, settings, dtypes, flags) the launchers can pick for N in 1..max_cols."""
    widths = range(1, max_cols + 1)
    # per value of the optional tensor's flag (HAS_SUM in the forward, HAS_DSUM in the backward)
    fwd = {opt: sorted({settings(n, with_sum=opt) for n in widths}) for opt in (False, True)}
    bwd = {opt: [settings(n, backward=True, with_sum=opt) for n in widths] for opt in (False, True)}
    two_pass = {opt: any(s is None for s in b) for opt, b in bwd.items()}
    bwd = {opt: sorted({s for s in b if s is not None}) for opt, b in bwd.items()}
    for x_dt in _X_DTYPES:
        for w_dt in dict.fromkeys((x_dt, "fp32")):
            for has_dropout in (False, True):
                # seeds from fastbert.reference.new_seed are >= 2**31 but for a 1 in 2**31 chance
                drop = {"seed": "i64" if has_dropout else "i32", "threshold": "i32", "scale": "fp32"}
                rows = {"DY": f"*{x_dt}", "stride_dym": "i32", "X": f"*{x_dt}", "stride_xm": "i32",
                        "RES": f"*{x_dt}", "stride_rm": "i32", "W": f"*{w_dt}",
                        "MEAN": "*fp32", "RSTD": "*fp32"}
                grads = {"DX": f"*{x_dt}", "stride_dxm": "i32", "DRES": f"*{x_dt}", "stride_drm": "i32",
                         "DW_PARTIAL": "*fp32", "DB_PARTIAL": "*fp32", "stride_pm": "i32"}
                if any(two_pass.values()):  # (no optional tensor)
                    yield from _variants("add_layer_norm_bwd_row_sums", _add_layer_norm_bwd_row_sums_kernel,
                                         ROW_SUMS_SETTINGS, {"MEAN_G": "*fp32", "MEAN_GX": "*fp32", **rows,
                                                             "M": "i32", "N": "i32", **drop}, x_dt, w_dt, has_dropout)
                for opt in (False, True):
                    builds = [("add_layer_norm_fwd", _add_layer_norm_fwd_kernel, s,
                               {"Y": f"*{x_dt}", "stride_ym": "i32", "MEAN": "*fp32", "RSTD": "*fp32",
                                "X": f"*{x_dt}", "stride_xm": "i32", "RES": f"*{x_dt}", "stride_rm": "i32",
                                "W": f"*{w_dt}", "B": f"*{w_dt}", "M": "i32", "N": "i32", "eps": "fp32", **drop})
                              for s in fwd[opt]]
                    builds += [("add_layer_norm_bwd", _add_layer_norm_bwd_kernel, s,
                                {**grads, **rows, "M": "i32", "N": "i32", "rows_per_program": "i32", **drop})
                               for s in bwd[opt]]
                    if two_pass[opt]:
                        builds.append(("add_layer_norm_bwd_tiled", _add_layer_norm_bwd_kernel, TILED_SETTINGS,
                                       {**grads, **rows, "MEAN_G": "*fp32", "MEAN_GX": "*fp32", "M": "i32",
                                        "N": "i32", "rows_per_program": "i32", **drop}))
                    for name, fn, s, sig in builds:
                        yield from _variants(name, fn, s, sig, x_dt, w_dt, has_dropout, opt)


def _norms(arg_names) -> Iterator[Tuple[Optional[bool], Optional[bool]]]:
    """(has_bias, rms) of a kernel's norm variants, None where it takes no such flag: a LayerNorm
    with and without bias, an RMSNorm (which has none)."""
    if "HAS_BIAS" in arg_names:
        yield from ((True, False), (False, False), (False, True))
    elif "RMS" in arg_names:
        yield from ((None, False), (None, True))
    else:
        yield None, None


def _variants(name, fn, s: Settings, sig, x_dt: str, w_dt: str, has_dropout: bool,
              optional: bool = False) -> Iterator[KernelBuild]:
    """The builds of one kernel at one settings row: LayerNorm with and without bias and RMSNorm
    (where it takes the flags), its optional tensor present or not (`optional`), aligned or not."""
    flags, extra = optional_rows_args(fn.arg_names, x_dt, optional)
    sig = {**sig, **extra}
    for has_bias, rms in _norms(fn.arg_names):
        constexprs = {"HAS_DROPOUT": has_dropout, "BLOCK_N": s.block_n, **flags}
        if has_bias is not None:
            constexprs["HAS_BIAS"] = has_bias
        if rms is not None:
            constexprs["RMS"] = rms
        if "BLOCK_M" in fn.arg_names:
            constexprs["BLOCK_M"] = s.block_m
        if "TWO_PASS" in fn.arg_names:  # the backward: pass 2 reads the row means, whole rows take None
            two_pass = "MEAN_G" in sig
            constexprs.update(TWO_PASS=two_pass, **({} if two_pass else {"MEAN_G": None, "MEAN_GX": None}))
        for aligned in (True, False):
            config = {"x": x_dt, "weight": w_dt, "dropout": has_dropout,
                      **({} if has_bias is None else {"bias": has_bias}), **({"rms": True} if rms else {}),
                      **{k[4:].lower(): v for k, v in flags.items() if k.startswith("HAS_")},
                      **{k: v for k, v in constexprs.items() if k.startswith("BLOCK")},
                      "aligned": aligned}
            yield KernelBuild(name, fn, sig, constexprs, s.num_warps, s.num_stages, config,
                              aligned_args(sig) if aligned else (), s.maxnreg)
