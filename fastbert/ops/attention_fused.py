"""The fused attention launchers behind one custom-op schema each (opaque to torch.compile), and
the autograd Function over them: what fastbert.ops.attention / varlen_attention run on the "cpp"
and "triton" backends (the launchers: csrc/attention.cpp, kernels/attention.py). Every optional
part of the kernels travels through here: the dropout seed, the rotary tables (rope_cos,
rope_sin), the local window (-1: none) and the relative position bias with its gradient.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from fastbert import backend as _backend
from fastbert import reference
from fastbert.ops.common import fused_op, needs_grad, seed_int

Tensor = torch.Tensor
Tensors3 = Tuple[Tensor, Tensor, Tensor]
Tensors4 = Tuple[Tensor, Tensor, Tensor, Tensor]


def _no_mask(device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.bool, device=device)


# --------------------------------------------------------------------------------------------
# custom ops: the fused launchers behind one schema


def _lse_like(q: torch.Tensor, varlen: bool) -> torch.Tensor:
    # padded: fp32 [batch, heads, seq]; varlen: fp32 [heads, total_tokens]
    shape = (q.shape[1], q.shape[0]) if varlen else q.shape[:3]
    return q.new_empty(shape, dtype=torch.float32)


def _keep_like(q: torch.Tensor, return_mask: bool, batch: int, seq: int) -> torch.Tensor:
    heads = q.shape[-2] if q.dim() == 3 else q.shape[1]
    return q.new_empty((batch, heads, seq, seq) if return_mask else (0,), dtype=torch.bool)


def _dense_like(t: torch.Tensor) -> torch.Tensor:
    # the launchers' outputs are contiguous, whatever the inputs' strides (empty_like would copy them)
    return t.new_empty(t.shape)


def _fake_fwd(q, k, v, key_mask, scale, dropout_p, seed, return_mask, rope_cos, rope_sin, window, rel_bias, backend):
    return _dense_like(q), _lse_like(q, False), _keep_like(q, return_mask, q.shape[0], q.shape[2])


@fused_op("attention_fwd", _fake_fwd)
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], scale: float, dropout_p: float,
                   seed: Optional[Tensor], return_mask: bool, rope_cos: Optional[Tensor], rope_sin: Optional[Tensor],
                   window: int, rel_bias: Optional[Tensor], backend: str) -> Tensors3:
    out, lse, keep = _backend.impl(backend, "attention").attention_forward(
        q, k, v, key_mask, scale, dropout_p, seed_int(seed), return_mask,
        **_extras(rope_cos, rope_sin, window, rel_bias)
    )
    return out, lse, keep if keep is not None and keep.numel() else _no_mask(q.device)


def _fake_bwd(do, q, k, v, out, lse, key_mask, scale, dropout_p, seed, rope_cos, rope_sin, window, rel_bias, backend):
    return _dense_like(q), _dense_like(k), _dense_like(v), _rel_grad_like(rel_bias, q)


@fused_op("attention_bwd", _fake_bwd)
def _attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, key_mask: Optional[Tensor],
                   scale: float, dropout_p: float, seed: Optional[Tensor], rope_cos: Optional[Tensor],
                   rope_sin: Optional[Tensor], window: int, rel_bias: Optional[Tensor], backend: str) -> Tensors4:
    launch = _backend.impl(backend, "attention").attention_backward
    return _grads(launch(do, q, k, v, out, lse, key_mask, scale, dropout_p, seed_int(seed),
                         **_extras(rope_cos, rope_sin, window, rel_bias)), q)


def _fake_varlen_fwd(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, rope_cos, rope_sin, window,
                     rel_bias, backend):
    batch = cu_seqlens.shape[0] - 1
    return _dense_like(q), _lse_like(q, True), _keep_like(q, return_mask, batch, max_seqlen)


@fused_op("varlen_attention_fwd", _fake_varlen_fwd)
def varlen_attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, scale: float,
                          dropout_p: float, seed: Optional[Tensor], return_mask: bool, rope_cos: Optional[Tensor],
                          rope_sin: Optional[Tensor], window: int, rel_bias: Optional[Tensor],
                          backend: str) -> Tensors3:
    out, lse, keep = _backend.impl(backend, "attention").varlen_attention_forward(
        q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, seed_int(seed), return_mask,
        **_extras(rope_cos, rope_sin, window, rel_bias)
    )
    return out, lse, keep if keep is not None and keep.numel() else _no_mask(q.device)


def _fake_varlen_bwd(do, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, dropout_p, seed, rope_cos, rope_sin,
                     window, rel_bias, backend):
    return _dense_like(q), _dense_like(k), _dense_like(v), _rel_grad_like(rel_bias, q)


@fused_op("varlen_attention_bwd", _fake_varlen_bwd)
def _varlen_attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens: Tensor,
                          max_seqlen: int, scale: float, dropout_p: float, seed: Optional[Tensor],
                          rope_cos: Optional[Tensor], rope_sin: Optional[Tensor], window: int,
                          rel_bias: Optional[Tensor], backend: str) -> Tensors4:
    return _grads(
        _backend.impl(backend, "attention").varlen_attention_backward(
            do, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, dropout_p, seed_int(seed),
            **_extras(rope_cos, rope_sin, window, rel_bias)
        ), q
    )


def _fake_keep(seed, batch, heads, seq, p, starts):
    return torch.empty((batch, heads, seq, seq), dtype=torch.bool, device=starts.device if starts is not None else "cpu")


@fused_op("attention_keep_mask", _fake_keep)
def torch_keep_mask(
    seed: torch.Tensor, batch: int, heads: int, seq: int, p: float, starts: Optional[torch.Tensor]
) -> torch.Tensor:
    # the torch backend's dropout mask, opaque to torch.compile like fastbert::dropout_keep_mask
    device = starts.device if starts is not None else seed.device
    return reference.attention_keep_mask(seed, batch, heads, seq, seq, p, starts, device)


# --------------------------------------------------------------------------------------------
# autograd


class AttentionFunction(torch.autograd.Function):
    """Both layouts through one Function: padded (key_mask, cu_seqlens None) or packed (cu_seqlens,
    max_seqlen)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, rope, window,
                rel_bias, backend):
        out, lse, keep = _fused_fwd(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask,
                                    rope, window, rel_bias, backend)
        ctx.save_for_backward(q, k, v, out, lse, key_mask, cu_seqlens, seed, *rope, rel_bias)
        ctx.max_seqlen, ctx.scale, ctx.dropout_p, ctx.window, ctx.backend = max_seqlen, scale, dropout_p, window, backend
        ctx.mark_non_differentiable(keep)
        return out, keep

    @staticmethod
    def backward(ctx, dout, _dkeep):
        q, k, v, out, lse, key_mask, cu_seqlens, seed, rope_cos, rope_sin, rel_bias = ctx.saved_tensors
        rest = (ctx.scale, ctx.dropout_p, seed, rope_cos, rope_sin, ctx.window, rel_bias, ctx.backend)
        if cu_seqlens is None:
            dq, dk, dv, drel = _attention_bwd(dout.contiguous(), q, k, v, out, lse, key_mask, *rest)
        else:
            dq, dk, dv, drel = _varlen_attention_bwd(dout.contiguous(), q, k, v, out, lse, cu_seqlens, ctx.max_seqlen,
                                                     *rest)
        drel = drel if rel_bias is not None and ctx.needs_input_grad[12] else None
        return (dq, dk, dv) + (None,) * 9 + (drel, None)


def _extras(rope_cos: Optional[Tensor], rope_sin: Optional[Tensor], window: int, rel_bias: Optional[Tensor]) -> dict:
    """The launchers' optional arguments (rotary tables, local window, relative bias), passed only when used."""
    out = {} if rope_cos is None else {"rope_cos": rope_cos, "rope_sin": rope_sin}
    if window >= 0:
        out["window"] = window
    return out if rel_bias is None else dict(out, rel_bias=rel_bias)


def _rel_grad_like(rel_bias: Optional[Tensor], q: Tensor) -> Tensor:
    return rel_bias.new_empty(rel_bias.shape) if rel_bias is not None else q.new_empty((0,), dtype=torch.float32)


def _grads(res, q: Tensor) -> Tensors4:
    """(dq, dk, dv, drel) of a launcher's backward; drel an empty fp32 tensor where it gives none."""
    res = tuple(res)
    return res if len(res) == 4 else res + (q.new_empty((0,), dtype=torch.float32),)


def _fused_fwd(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, rope, window, rel_bias,
               backend):
    extra = (*rope, window, rel_bias, backend)
    if cu_seqlens is None:
        return attention_fwd(q, k, v, key_mask, scale, dropout_p, seed, return_mask, *extra)
    return varlen_attention_fwd(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, *extra)


def run_fused(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, rope, window, rel_bias,
               backend, mask_shape):
    """(out, keep-mask or None) of a fused backend, through autograd when an input needs a gradient;
    the keep-mask is all True (of mask_shape) when no dropout ran. rope: the (cos, sin) rotary
    tables, or (None, None); window: local attention's reach, -1 for none; rel_bias: the relative
    position bias [heads, 2n - 1], or None."""
    q, k, v = (_rows_contiguous(t) for t in (q, k, v))
    args = (q, k, v, key_mask, cu_seqlens, max_seqlen, scale, float(dropout_p), seed, bool(return_mask), rope, window,
            rel_bias, backend)
    if needs_grad(q, k, v, *([rel_bias] if rel_bias is not None else [])):
        out, keep = AttentionFunction.apply(*args)
    else:
        out, _, keep = _fused_fwd(*args)
    if return_mask and keep.numel() == 0:
        keep = torch.ones(mask_shape, dtype=torch.bool, device=q.device)
    return out, keep


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()
