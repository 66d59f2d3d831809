"""dropout + residual add + LayerNorm: layer_norm(dropout(x) + residual), fused into one pass; and
the same with RMSNorm (add_rms_norm: a Llama-style encoder's norm, EuroBERT's), the same kernels.

BERT's post-LN tail (BertSelfOutput, BertOutput). Statistics (mean, rstd) are kept in float32; the
backward recomputes dropout(x) + residual from x, residual and the dropout seed, so neither the sum
nor the mask is ever stored. A pre-LN encoder (ModernBERT) keeps the sum as its residual stream:
return_sum=True writes it out in the same pass, and its gradient joins the norm's in the backward's
one pass. Layers: custom ops -> autograd Functions -> functional API; kernels in
kernels/layer_norm.py (Triton) and csrc/layer_norm.cpp (C++).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from fastbert import backend as fb_backend
from fastbert import reference
from fastbert.ops.checks import check_device, check_float, check_vector
from fastbert.ops.common import as_rows, fused_op, needs_grad, op_seed, save_seed, saved_seed, seed_int

Tensor = torch.Tensor
MAX_HIDDEN = 8192  # the fused kernels keep a whole row on chip


def _fake_fwd(x, residual, weight, bias, eps, dropout_p, seed, backend, rms=False):
    stats = x.new_empty(x.shape[:1], dtype=torch.float32)
    return torch.empty_like(x), stats, torch.empty_like(stats)


@fused_op("add_layer_norm_fwd", _fake_fwd)
def add_layer_norm_fwd(x: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                        dropout_p: float, seed: Optional[Tensor], backend: str,
                        rms: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    # x, residual: [rows, hidden]; weight, bias: [hidden] (bias None: none); seed: op_seed's;
    # rms: an RMSNorm (bias None) -> y [rows, hidden] in x.dtype, mean [rows] fp32 (0 with rms), rstd [rows] fp32
    return tuple(
        fb_backend.impl(backend, "layer_norm").add_layer_norm_forward(
            x, residual, weight, bias, eps, dropout_p, seed_int(seed), rms=rms
        )
    )


def _fake_sum_fwd(x, residual, weight, bias, eps, dropout_p, seed, backend, rms=False):
    return (*_fake_fwd(x, residual, weight, bias, eps, dropout_p, seed, backend), torch.empty_like(x))


@fused_op("add_layer_norm_sum_fwd", _fake_sum_fwd)
def add_layer_norm_sum_fwd(x: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                           dropout_p: float, seed: Optional[Tensor],
                           backend: str, rms: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    # as add_layer_norm_fwd -> (y, mean, rstd, s), s = dropout(x) + residual [rows, hidden] in x.dtype
    return tuple(
        fb_backend.impl(backend, "layer_norm").add_layer_norm_forward(
            x, residual, weight, bias, eps, dropout_p, seed_int(seed), return_sum=True, rms=rms
        )
    )


def _fake_bwd(dy, x, residual, weight, mean, rstd, dropout_p, seed, backend, dsum=None, rms=False):
    return torch.empty_like(x), torch.empty_like(residual), torch.empty_like(weight), torch.empty_like(weight)


@fused_op("add_layer_norm_bwd", _fake_bwd)
def _add_layer_norm_bwd(dy: Tensor, x: Tensor, residual: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor,
                        dropout_p: float, seed: Optional[Tensor], backend: str,
                        dsum: Optional[Tensor] = None, rms: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    # -> dx, dresidual [rows, hidden] in x.dtype; dweight, dbias [hidden] in weight.dtype (fp32 sums);
    # dsum: the gradient of the sum (return_sum), [rows, hidden] in x.dtype, or None; rms: the forward's
    impl = fb_backend.impl(backend, "layer_norm")
    args = (dy, x, residual, weight, mean, rstd, dropout_p, seed_int(seed))
    return tuple(impl.add_layer_norm_backward(*args, dsum=dsum, rms=rms))


def _fake_keep(seed, rows, cols, p, device):
    return torch.empty((rows, cols), dtype=torch.bool, device=device)


@fused_op("dropout_keep_mask", _fake_keep)
def _dropout_keep_mask(seed: Tensor, rows: int, cols: int, p: float, device: torch.device) -> Tensor:
    # -> bool [rows, cols]: the mask of fastbert.reference.dropout_keep_mask, kept opaque to
    # torch.compile (inlined, its 10 Philox rounds of integer ops swamp inductor's lowering)
    return reference.dropout_keep_mask(seed, (rows, cols), p, device)


class AddLayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, dropout_p, seed, backend, rms):
        y, mean, rstd = add_layer_norm_fwd(x, residual, weight, bias, eps, dropout_p, seed, backend, rms)
        ctx.save_for_backward(x, residual, weight, mean, rstd, save_seed(ctx, seed))
        ctx.dropout_p, ctx.backend, ctx.has_bias, ctx.rms = dropout_p, backend, bias is not None, rms
        return y

    @staticmethod
    def backward(ctx, dy):
        x, residual, weight, mean, rstd, seed = ctx.saved_tensors
        dx, dres, dw, db = _add_layer_norm_bwd(
            dy.contiguous(), x, residual, weight, mean, rstd, ctx.dropout_p, saved_seed(ctx, seed), ctx.backend,
            None, ctx.rms
        )
        return dx, dres, dw, db if ctx.has_bias else None, None, None, None, None, None


class AddLayerNormSumFunction(torch.autograd.Function):
    """add_layer_norm with return_sum: (y, s); the backward takes the gradients of both in one pass."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, dropout_p, seed, backend, rms):
        y, mean, rstd, s = add_layer_norm_sum_fwd(x, residual, weight, bias, eps, dropout_p, seed, backend, rms)
        ctx.save_for_backward(x, residual, weight, mean, rstd, save_seed(ctx, seed))
        ctx.dropout_p, ctx.backend, ctx.has_bias, ctx.rms = dropout_p, backend, bias is not None, rms
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        return y, s

    @staticmethod
    def backward(ctx, dy, ds):
        x, residual, weight, mean, rstd, seed = ctx.saved_tensors
        only_sum = dy is None  # the norm unused: no gradient for weight and bias, dy = 0 for the rest
        dy = torch.zeros_like(x) if only_sum else dy.contiguous()
        dx, dres, dw, db = _add_layer_norm_bwd(dy, x, residual, weight, mean, rstd, ctx.dropout_p,
                                               saved_seed(ctx, seed), ctx.backend,
                                               None if ds is None else ds.contiguous(), ctx.rms)
        if only_sum:
            dw = db = None
        return dx, dres, dw, db if ctx.has_bias else None, None, None, None, None, None


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    eps: float = 1e-12,
    *,
    dropout_p: float = 0.0,
    return_sum: bool = False,
    backend: Optional[str] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """layer_norm(dropout(x) + residual) over the last dim, one fused pass forward and backward.

    x, residual: [..., hidden], the same shape and dtype (float32/float16/bfloat16; any layout,
    non-contiguous inputs are copied); under torch.autocast the narrower dtype is promoted to the
    wider one, as the addition does in an unfused model. weight, bias: [hidden], x's dtype or float32;
    bias None for a LayerNorm without bias (ModernBERT's norms). Returns
    [..., hidden] in x's dtype; mean and rstd are computed and kept in float32.
    dropout_p: probability of zeroing an element of x (kept ones scaled by 1/(1-p)). The mask is a
    function of `seed` (an int in [0, 2**63); drawn from torch's RNG, or `generator`, when None), the
    same on every backend (fastbert.reference.dropout_keep_mask), regenerated in the backward.
    return_sum: return (y, s), s = dropout(x) + residual in x's dtype, the sum the norm was taken of
    (a pre-LN encoder's residual stream), written in the same pass; gradients flow from both.
    backend: "triton", "cpp", "torch" or None (automatic). The fused backends take hidden <= 8192.
    """
    return _add_norm("add_layer_norm", x, residual, weight, bias, eps, dropout_p, return_sum, backend, seed, generator,
                     False)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    dropout_p: float = 0.0,
    return_sum: bool = False,
    backend: Optional[str] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """rms_norm(dropout(x) + residual) * weight over the last dim (torch.nn.RMSNorm's, and a
    Llama-style encoder's: EuroBERT's), one fused pass forward and backward: add_layer_norm's kernels
    with no mean taken out and no bias, its arguments otherwise (return_sum: (y, s), a pre-norm
    encoder's residual stream s = dropout(x) + residual written in the same pass)."""
    return _add_norm("add_rms_norm", x, residual, weight, None, eps, dropout_p, return_sum, backend, seed, generator,
                     True)


def _add_norm(op: str, x, residual, weight, bias, eps, dropout_p, return_sum, backend, seed, generator, rms: bool):
    """add_layer_norm, or add_rms_norm (rms)."""
    x, residual = _check_inputs(op, x, residual, weight, bias, eps, dropout_p)
    backend = fb_backend.resolve(backend, x)
    seed_t = op_seed(seed, generator) if dropout_p > 0 else None
    if backend == "torch" or x.numel() == 0:
        return _torch_add_layer_norm(x, residual, weight, bias, eps, dropout_p, seed_t, return_sum, rms)
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        raise ValueError(
            f"fastbert.ops.{op}: hidden size {hidden} is above the supported maximum {MAX_HIDDEN} "
            f"of the {backend!r} backend; use backend='torch' for larger rows"
        )
    args = (as_rows(x), as_rows(residual), weight.contiguous(), None if bias is None else bias.contiguous(), float(eps),
            float(dropout_p), seed_t)
    grad = needs_grad(x, residual, weight, *(() if bias is None else (bias,)))
    if not grad and backend == "triton" and not torch.compiler.is_compiling():
        # no backward to come: the launcher keeps no statistics (the host's allocations are launches
        # on a GPU; the custom op's schema, which torch.compile sees, returns them)
        y, _, _, *s = fb_backend.impl(backend, "layer_norm").add_layer_norm_forward(
            *args[:-1], seed_int(seed_t), return_sum, stats=False, rms=rms)
        return (y.view(x.shape), s[0].view(x.shape)) if return_sum else y.view(x.shape)
    if return_sum:
        if grad:
            y, s = AddLayerNormSumFunction.apply(*args, backend, rms)
        else:
            y, _, _, s = add_layer_norm_sum_fwd(*args, backend, rms)
        return y.view(x.shape), s.view(x.shape)
    if grad:
        return AddLayerNormFunction.apply(*args, backend, rms).view(x.shape)
    return add_layer_norm_fwd(*args, backend, rms)[0].view(x.shape)


def _check_inputs(op: str, x, residual, weight, bias, eps, dropout_p) -> Tuple[Tensor, Tensor]:
    """The arguments of add_layer_norm / add_rms_norm (op) checked; x and residual promoted to one
    dtype under autocast."""
    check_float(op, "x", x)
    check_float(op, "residual", residual)
    if x.dim() == 0:
        raise ValueError(f"fastbert.ops.{op}: x must have at least one dim (the hidden size)")
    if residual.shape != x.shape:
        raise ValueError(
            f"fastbert.ops.{op}: residual has shape {tuple(residual.shape)} but x has shape "
            f"{tuple(x.shape)}; they must match"
        )
    if residual.dtype != x.dtype:
        if not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"fastbert.ops.{op}: residual has dtype {residual.dtype} but x has dtype {x.dtype}; they must match "
                "(under torch.autocast the narrower one is promoted)"
            )
        # under autocast a GEMM's low-precision output meets a float32 residual: promote, as the
        # addition x + residual does in an unfused model
        wide = torch.promote_types(x.dtype, residual.dtype)
        x, residual = x.to(wide), residual.to(wide)
    check_device(op, "residual", residual, x)
    check_vector(op, "weight", weight, x)
    if bias is not None:
        check_vector(op, "bias", bias, x)
        if weight.dtype != bias.dtype:
            raise TypeError(f"fastbert.ops.{op}: weight is {weight.dtype} but bias is {bias.dtype}; they must match")
    if not eps > 0:
        raise ValueError(f"fastbert.ops.{op}: eps must be > 0, got {eps}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"fastbert.ops.{op}: dropout_p must be in [0, 1), got {dropout_p}")
    return x, residual


def _torch_add_layer_norm(x, residual, weight, bias, eps, dropout_p, seed, return_sum, rms):
    """The "torch" backend: the reference layer, with the dropout mask of the fused backends."""
    keep = None
    if dropout_p > 0 and x.numel() > 0:
        hidden = x.shape[-1]
        keep = _dropout_keep_mask(seed, x.numel() // hidden, hidden, dropout_p, x.device).view(x.shape)
    if rms:
        return reference.add_rms_norm(x, residual, weight, eps, dropout_p, keep_mask=keep, return_sum=return_sum)
    return reference.add_layer_norm(x, residual, weight, bias, eps, dropout_p, keep_mask=keep, return_sum=return_sum)
