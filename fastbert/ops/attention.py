"""Scaled-dot-product attention with a padding mask, padded and packed (varlen).

    attention(q, k, v, attention_mask=None, *, dropout_p=0.0, scale=None, backend=None)
        q, k, v:        [batch, heads, seq, head_dim]
        attention_mask: [batch, seq], 1/True = real token (HF convention); None = no padding
        returns:        [batch, heads, seq, head_dim]; zeros at padded query positions
    varlen_attention(q, k, v, cu_seqlens, max_seqlen, *, dropout_p=0.0, scale=None, backend=None)
        q, k, v:        [total_tokens, heads, head_dim], sequences packed one after another
        cu_seqlens:     int32 [batch + 1], sequence b is tokens cu_seqlens[b]:cu_seqlens[b + 1]
        max_seqlen:     int >= every sequence's length
        returns:        [total_tokens, heads, head_dim]

Padded keys get no weight; a query with no real key returns zeros (never NaN), and padded queries
pass no gradient. Dropout acts on the probabilities with fastbert's counter-based rule
(fastbert.reference: the same mask on every backend and in both layouts, regenerated in the
backward). Backends: "triton" (flash-style kernels, kernels/attention/), "cpp" (real tokens
only, csrc/attention.cpp), "torch" (torch.nn.functional.scaled_dot_product_attention; the
reference layer when dropout is on, so the mask follows the same rule, and for local attention).

Layers: custom ops (opaque to torch.compile) -> autograd Functions (both below) ->
functional API (here: the checks, the torch backend, the entry points).
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F

from fastbert import backend as fb_backend
from fastbert import layouts, reference
from fastbert.ops import gemm_timing
from fastbert.ops.checks import check_device, check_float, check_mask, check_tensor
from fastbert.ops.common import fused_op, needs_grad, op_seed, save_seed, saved_seed, seed_int
from fastbert.ops.linear import linear
from fastbert.ops.padding import heads_packed, heads_padded

# ============================================================================================
# The fused attention launchers behind one custom-op schema each (opaque to torch.compile), and
# the autograd Function over them: what fastbert.ops.attention / varlen_attention run on the "cpp"
# and "triton" backends (the launchers: csrc/attention.cpp, kernels/attention/launchers.py). Every optional
# part of the kernels travels through here: the dropout seed, the rotary tables (rope_cos,
# rope_sin), the local window (-1: none) and the relative position bias with its gradient.

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


# bf16 attention on a CPU that multiplies bf16 natively can run a sequence's two products on the
# BLAS's bf16 GEMM (csrc/kernels/attention_forward.cpp). Between a model's bf16 products (oneDNN's, on
# AMX) that gained on long sequences and lost on short ones (benchmarks/LOG.md), and where the two
# cross depends on the CPU: the shortest length from which it gains is timed here, once per
# (threads, kernel level) (fastbert.ops.gemm_timing), on batches of sequences of each of
# BF16_LENGTHS tokens, each call after the QKV product that makes its q, k and v, as a model runs
# it. The extension's whole-layer routes, which run the attention from C++, take whatever was last
# chosen (fp32 products until then).
BF16_LENGTHS = (16, 32, 64, 96, 128, 192, 256, 384, 512)
_BF16_MIN_LEN = gemm_timing.cache()
_forced_bf16: list = [None]


@contextlib.contextmanager
def forced_bf16_products(on: bool) -> Iterator[None]:
    """Inside the block the cpp attention's bf16 forward multiplies in bf16 (on) or in fp32 at every
    length, whatever was timed faster: for comparisons (on needs the extension's
    attention_bf16_available())."""
    previous = _forced_bf16[0]
    _forced_bf16[0] = 0 if on else -1
    try:
        yield
    finally:
        _forced_bf16[0] = previous


def bf16_min_len(ext) -> int:
    """The shortest sequence whose bf16 forward multiplies in bf16 here (-1: none), timed at the
    first call (and set in the extension)."""
    n = _forced_bf16[0]
    if n is None:
        key = gemm_timing.here()
        n = _BF16_MIN_LEN.get(key)
        if n is None:
            n = _BF16_MIN_LEN[key] = _bf16_min_len_timed(ext)
    if ext.attention_bf16_min_len() != n:
        ext.set_attention_bf16_min_len(n)
    return n


def _bf16_min_len_timed(ext) -> int:
    """The shortest of BF16_LENGTHS from which every longer one ran faster on bf16 products; -1."""
    if not ext.attention_bf16_available():
        return -1
    previous = ext.attention_bf16_min_len()
    try:
        with torch.inference_mode():
            faster = [_bf16_faster_at(ext, n) for n in BF16_LENGTHS]
    finally:
        ext.set_attention_bf16_min_len(previous)
    shortest = -1
    for n, gains in zip(reversed(BF16_LENGTHS), reversed(faster)):
        if not gains:
            break
        shortest = n
    return shortest


def _bf16_faster_at(ext, n: int) -> bool:
    """Both products timed on sequences of n tokens (about 1,024 in all, 8 heads of 64), each call
    after its QKV product (fastbert.ops.linear)."""
    tokens, heads = max(1, 1024 // n) * n, 8
    g = torch.Generator().manual_seed(n)
    x = torch.randn(tokens, heads * 64, generator=g).bfloat16()
    w = (torch.randn(3 * heads * 64, heads * 64, generator=g) * 0.02).bfloat16()
    cu = torch.arange(0, tokens + 1, n, dtype=torch.int32)

    def run(path: str) -> None:
        ext.set_attention_bf16_min_len(0 if path == "bf16" else -1)
        q, k, v = linear(x, w, backend="cpp").view(tokens, 3, heads, 64).unbind(1)
        ext.varlen_attention_forward(q, k, v, cu, n, 0.125, 0.0, 0, False)

    seconds = gemm_timing.time_paths(["fp32", "bf16"], run)
    return seconds["bf16"] < seconds["fp32"]


@fused_op("attention_fwd", _fake_fwd)
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], scale: float, dropout_p: float,
                   seed: Optional[Tensor], return_mask: bool, rope_cos: Optional[Tensor], rope_sin: Optional[Tensor],
                   window: int, rel_bias: Optional[Tensor], backend: str) -> Tensors3:
    if backend == "cpp" and q.dtype == torch.bfloat16:
        bf16_min_len(fb_backend.impl(backend, "attention"))
    out, lse, keep = fb_backend.impl(backend, "attention").attention_forward(
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
    launch = fb_backend.impl(backend, "attention").attention_backward
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
    if backend == "cpp" and q.dtype == torch.bfloat16:
        bf16_min_len(fb_backend.impl(backend, "attention"))
    out, lse, keep = fb_backend.impl(backend, "attention").varlen_attention_forward(
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
        fb_backend.impl(backend, "attention").varlen_attention_backward(
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
    device = starts.device if starts is not None else "cpu"  # the seed lives on the host
    return reference.attention_keep_mask(seed, batch, heads, seq, seq, p, starts, device)


# --------------------------------------------------------------------------------------------
# autograd


class AttentionFunction(torch.autograd.Function):
    """Both layouts through one Function: padded (key_mask, cu_seqlens None) or packed (cu_seqlens,
    max_seqlen)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, rope, window,
                rel_bias, backend):
        ctx.direct = backend == "triton" and not torch.compiler.is_compiling()
        if ctx.direct:  # the launchers straight (no custom op, whose schema wants a tensor for every output)
            out, lse, keep = launch_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed,
                                            return_mask, rope, window, rel_bias, keep_lse=True)
        else:
            out, lse, keep = _fused_fwd(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask,
                                        rope, window, rel_bias, backend)
        ctx.save_for_backward(q, k, v, out, lse, key_mask, cu_seqlens, save_seed(ctx, seed), *rope, rel_bias)
        ctx.max_seqlen, ctx.scale, ctx.dropout_p, ctx.window, ctx.backend = max_seqlen, scale, dropout_p, window, backend
        if keep is not None:
            ctx.mark_non_differentiable(keep)
        ctx.set_materialize_grads(False)  # the keep-mask's gradient arrives as None, not as a tensor of zeros
        return out, keep

    @staticmethod
    def backward(ctx, dout, _dkeep):
        if dout is None:
            return (None,) * 14
        q, k, v, out, lse, key_mask, cu_seqlens, seed, rope_cos, rope_sin, rel_bias = ctx.saved_tensors
        if ctx.direct:
            dq, dk, dv, drel = launch_backward(dout.contiguous(), q, k, v, out, lse, key_mask, cu_seqlens,
                                               ctx.max_seqlen, ctx.scale, ctx.dropout_p, saved_seed(ctx, seed),
                                               (rope_cos, rope_sin), ctx.window, rel_bias)
            return (dq, dk, dv) + (None,) * 9 + (drel if ctx.needs_input_grad[12] else None, None)
        rest = (ctx.scale, ctx.dropout_p, saved_seed(ctx, seed), rope_cos, rope_sin, ctx.window, rel_bias, ctx.backend)
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
    elif backend == "triton" and not torch.compiler.is_compiling():
        # no backward to come (the custom op's schema, which torch.compile sees, returns a log-sum-exp)
        out, keep = inference_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, float(dropout_p), seed_int(seed),
                                      bool(return_mask), rope, window, rel_bias)
    else:
        out, _, keep = _fused_fwd(*args)
    if return_mask and (keep is None or keep.numel() == 0):
        keep = torch.ones(mask_shape, dtype=torch.bool, device=q.device)
    return out, keep


def launch_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale: float, dropout_p: float, seed, return_mask: bool,
                   rope, window: int, rel_bias, out: Optional[Tensor] = None, keep_lse: bool = False):
    """(out, lse or None, keep-mask or None) of the Triton launchers called straight (padded, or
    packed with cu_seqlens), outside torch.compile: no custom op between, no tensor made to stand for
    an absent output. rope: (cos, sin) or (None, None); seed: an int or None; out: where the output
    goes (q itself allowed, as the launchers say) or None: fresh; keep_lse: keep the log-sum-exp for
    a backward (else nothing is allocated for it)."""
    launchers = fb_backend.impl("triton", "attention")
    extra = dict(_extras(rope[0], rope[1], window, rel_bias), out=out, keep_lse=keep_lse)
    if cu_seqlens is None:
        return launchers.attention_forward(q, k, v, key_mask, scale, dropout_p, seed_int(seed), return_mask, **extra)
    return launchers.varlen_attention_forward(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, seed_int(seed),
                                              return_mask, **extra)


def launch_backward(do, q, k, v, out, lse, key_mask, cu_seqlens, max_seqlen, scale: float, dropout_p: float, seed,
                    rope, window: int, rel_bias, grads=None):
    """(dq, dk, dv, drel or None) of the Triton launchers called straight, as launch_forward; grads:
    where dq, dk, dv go (the launchers' grads=) or None: fresh."""
    launchers = fb_backend.impl("triton", "attention")
    extra = dict(_extras(rope[0], rope[1], window, rel_bias), grads=grads)
    if cu_seqlens is None:
        res = launchers.attention_backward(do, q, k, v, out, lse, key_mask, scale, dropout_p, seed_int(seed), **extra)
    else:
        res = launchers.varlen_attention_backward(do, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, dropout_p,
                                                  seed_int(seed), **extra)
    return tuple(res) if len(res) == 4 else (*res, None)


def inference_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale: float, dropout_p: float, seed: int,
                      return_mask: bool, rope, window: int, rel_bias, out: Optional[Tensor] = None):
    """(out, keep-mask or None) of launch_forward with no backward to come: no log-sum-exp kept, so
    nothing allocated for it (on a GPU the host's allocations are launches)."""
    out, _, keep = launch_forward(q, k, v, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, rope,
                                  window, rel_bias, out=out)
    return out, keep


# --------------------------------------------------------------------------------------------
# the joined QKV route: a layer's training step on Triton


def qkv_views(qkv: Tensor, shape, heads: int, packed: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k, v as views of the QKV rows qkv ([..., 3 * width] of a hidden state of `shape`): packed
    [tokens, heads, d] each, padded [batch, heads, seq, d] each."""
    d = shape[-1] // heads
    if packed:
        return qkv.view(-1, 3, heads, d).unbind(1)
    return qkv.view(shape[0], shape[1], 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)


def heads_view(rows: Tensor, shape, heads: int, packed: bool) -> Tensor:
    """rows shaped `shape` ([tokens, width] or [batch, seq, width]) as the launchers' [tokens, heads,
    d] or [batch, heads, seq, d] (a view)."""
    d = shape[-1] // heads
    if packed:
        return rows.view(-1, heads, d)
    return rows.view(shape[0], shape[1], heads, d).transpose(1, 2)


def joined_lse_shape(shape, heads: int, packed: bool) -> Tuple[int, ...]:
    """The shape of joined_forward's log-sum-exp (fp32) for a hidden state of `shape`."""
    return (heads, shape[0]) if packed else (shape[0], heads, shape[1])


def joined_forward(qkv: Tensor, shape, heads: int, key_mask, cu_seqlens, max_seqlen, scale: float, dropout_p: float,
                   seed, rope, window: int, rel_bias, out: Optional[Tensor] = None,
                   lse_out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """(context rows shaped `shape`, log-sum-exp) of the attention on the QKV rows qkv of a hidden
    state of `shape` (qkv_views), the kernel writing the context rows in place (no transpose copy):
    the forward of a layer's training step on Triton (JoinedAttentionFunction, ops.layer_training).
    The other arguments as launch_forward's. Without a relative bias, through the launches bound
    once per specialization (the launchers' qkv_attention_forward). out, lse_out: where the context
    rows (contiguous, `shape`) and, without a relative bias, the log-sum-exp (joined_lse_shape) go,
    for a caller that allocates a step's tensors at once."""
    packed = cu_seqlens is not None
    rows = qkv.new_empty(shape) if out is None else out
    if rel_bias is None:
        seq = max_seqlen if packed else shape[1]
        return fb_backend.impl("triton", "attention").qkv_attention_forward(
            _joined_rows(qkv), heads, key_mask, cu_seqlens, seq, scale, *rope, window, dropout_p=dropout_p,
            seed=seed_int(seed), out=rows, keep_lse=True, lse_out=lse_out)
    _, lse, _ = launch_forward(*qkv_views(qkv, shape, heads, packed), key_mask, cu_seqlens, max_seqlen, scale,
                               dropout_p, seed, False, rope, window, rel_bias,
                               out=heads_view(rows, shape, heads, packed), keep_lse=True)
    return rows, lse


def joined_backward(drows: Tensor, qkv: Tensor, rows: Tensor, lse: Tensor, shape, heads: int, key_mask, cu_seqlens,
                    max_seqlen, scale: float, dropout_p: float, seed, rope, window: int, rel_bias,
                    grad_out: Optional[Tensor] = None, delta_out: Optional[Tensor] = None
                    ) -> Tuple[Tensor, Optional[Tensor]]:
    """(dqkv, drel or None) of joined_forward: dq, dk, dv written into the slices of one tensor
    shaped like qkv, its gradient, where splitting qkv by autograd would have them stacked into it (a
    copy of all three). drows: the context rows' gradient; rows, lse: joined_forward's. grad_out:
    where dqkv goes (qkv's shape, contiguous) and delta_out, the kernels' row sums' memory (lse's
    shape, fp32; without a relative bias), for a caller that allocates a step's tensors at once."""
    packed = cu_seqlens is not None
    drows = drows if drows.is_contiguous() else drows.contiguous()
    if rel_bias is None:
        seq = max_seqlen if packed else shape[1]
        dqkv = fb_backend.impl("triton", "attention").qkv_attention_backward(
            drows, _joined_rows(qkv), rows, lse, heads, key_mask, cu_seqlens, seq, scale, *rope, window,
            dropout_p=dropout_p, seed=seed_int(seed), grad_out=None if grad_out is None else _joined_rows(grad_out),
            delta_out=delta_out)
        return (dqkv if qkv.dim() == 2 else dqkv.view(qkv.shape)), None
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device) if grad_out is None else grad_out
    *_, drel = launch_backward(heads_view(drows, shape, heads, packed), *qkv_views(qkv, shape, heads, packed),
                               heads_view(rows, shape, heads, packed), lse, key_mask, cu_seqlens, max_seqlen, scale,
                               dropout_p, seed, rope, window, rel_bias, grads=qkv_views(dqkv, shape, heads, packed))
    return dqkv, drel


def _joined_rows(qkv: Tensor) -> Tensor:
    # the QKV rows as [rows, 3 * width] (a view where they come shaped [batch, seq, 3 * width])
    return qkv if qkv.dim() == 2 else qkv.view(-1, qkv.shape[-1])


class JoinedAttentionFunction(torch.autograd.Function):
    """joined_forward and joined_backward as an autograd node: qkv ([..., 3 * width] rows of a
    hidden state of `shape`) in, the context rows shaped `shape` out."""

    @staticmethod
    def forward(ctx, qkv, shape, heads, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, rope, window,
                rel_bias):
        rows, lse = joined_forward(qkv, shape, heads, key_mask, cu_seqlens, max_seqlen, scale, dropout_p, seed, rope,
                                   window, rel_bias)
        ctx.save_for_backward(qkv, rows, lse, key_mask, cu_seqlens, *rope, rel_bias)
        ctx.args = (shape, heads, max_seqlen, scale, dropout_p, seed, window)
        return rows

    @staticmethod
    def backward(ctx, drows):
        qkv, rows, lse, key_mask, cu_seqlens, rope_cos, rope_sin, rel_bias = ctx.saved_tensors
        shape, heads, max_seqlen, scale, dropout_p, seed, window = ctx.args
        dqkv, drel = joined_backward(drows, qkv, rows, lse, shape, heads, key_mask, cu_seqlens, max_seqlen, scale,
                                     dropout_p, seed, (rope_cos, rope_sin), window, rel_bias)
        return (dqkv,) + (None,) * 10 + (drel if ctx.needs_input_grad[11] else None,)


def joined_attention(qkv: Tensor, shape, heads: int, mask: Optional[Tensor], packed: Optional[Tuple[Tensor, int]], *,
                     dropout_p: float, seed: Optional[int], backend: Optional[str], rotary_base: Optional[float] = None,
                     window: Optional[int] = None, relative_bias: Optional[Tensor] = None) -> Optional[Tensor]:
    """A layer's attention on its QKV projection rows qkv ([..., 3 * width], contiguous) of a hidden
    state of `shape` ([tokens, width] with packed = (cu_seqlens, max_seqlen), the model's own; or
    [batch, seq, width] with mask, bool [batch, seq] or None) -> the context rows shaped `shape`,
    through JoinedAttentionFunction where it runs: the Triton backend, a gradient to come, outside
    torch.compile. Else None: the caller splits qkv into q, k, v for attention / varlen_attention.
    The options as theirs; seed: an int (DropoutSeeds.take) or None: drawn here."""
    backend = fb_backend.resolve(backend, qkv)
    if (backend != "triton" or torch.compiler.is_compiling() or not qkv.is_contiguous()
            or not needs_grad(qkv, *(() if relative_bias is None else (relative_bias,)))):
        return None
    op = "attention"
    check_float(op, "qkv", qkv)
    q = qkv_views(qkv, shape, heads, packed is not None)[0]  # for the checks' shapes
    d = q.shape[-1]
    positions = packed[1] if packed is not None else shape[1]
    scale = _check_options(op, backend, d, dropout_p, None, positions)
    if mask is not None:
        mask = _as_bool_mask(op, mask, q)
    rope = _rope(op, rotary_base, backend, d, positions, qkv.device)
    reach = _check_window(op, window)
    _check_relative(op, relative_bias, q, positions)
    seed = (seed if seed is not None else op_seed(None)) if dropout_p > 0 else None
    cu, max_seqlen = packed if packed is not None else (None, None)
    return JoinedAttentionFunction.apply(qkv, tuple(shape), heads, mask, cu, max_seqlen, scale, float(dropout_p), seed,
                                         rope, reach, relative_bias)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# ============================================================================================
# the public ops

TRITON_HEAD_DIMS = (16, 32, 64, 80, 96, 128)  # what the Triton kernels compile for
MAX_HEAD_DIM = 256  # the cpp backend




# --------------------------------------------------------------------------------------------
# checks shared by both entry points


def _check_qkv(op: str, q, k, v, dims: int, layout: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(op, name, t)
    if q.dim() != dims:
        raise ValueError(f"fastbert.ops.{op}: q must be {layout}, got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(
                f"fastbert.ops.{op}: {name} has shape {tuple(t.shape)} but q has shape {tuple(q.shape)}; "
                f"q, k and v must all be {layout} with the same sizes"
            )
        if t.dtype != q.dtype:
            raise TypeError(f"fastbert.ops.{op}: {name} has dtype {t.dtype} but q has dtype {q.dtype}; they must match")
        check_device(op, name, t, q, like="q")


def _check_options(op: str, backend: str, head_dim: int, dropout_p: float, scale: Optional[float], seq: int) -> float:
    if backend == "triton" and head_dim not in TRITON_HEAD_DIMS:
        raise ValueError(
            f"fastbert.ops.{op}: head_dim {head_dim} is not supported by the 'triton' backend; "
            f"supported: {TRITON_HEAD_DIMS}"
        )
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"fastbert.ops.{op}: head_dim {head_dim} is not supported; it must be in 1..{MAX_HEAD_DIM}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"fastbert.ops.{op}: dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p > 0 and seq > reference.MAX_DROPOUT_SEQLEN:
        raise ValueError(
            f"fastbert.ops.{op}: attention dropout takes sequences of at most {reference.MAX_DROPOUT_SEQLEN} "
            f"tokens, got {seq}"
        )
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"fastbert.ops.{op}: scale must be a finite number > 0, got {scale!r}")
    return float(scale)


def _rope(op: str, base: Optional[float], backend: str, head_dim: int, positions: int, device):
    """(cos, sin) rotary tables of `base` covering `positions` rows, or (None, None) for no rotation."""
    if base is None:
        return None, None
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"fastbert.ops.{op}: rotary_base must be a finite number > 1, got {base!r}")
    if head_dim % 2:
        raise ValueError(f"fastbert.ops.{op}: rotary embeddings need an even head_dim, got {head_dim}")
    return rotary_for(float(base), head_dim, positions, device)


def rotary_for(base: float, head_dim: int, positions: int, device):
    """The (cos, sin) rotary tables the fused backends take for `positions` rows (unchecked
    arguments): cached, in whole powers of two of rows, so that a few entries serve every length."""
    return rotary_tables(base, head_dim, max(64, 1 << max(positions - 1, 0).bit_length()), str(device))


def _check_relative(op: str, rel: Optional[torch.Tensor], q: torch.Tensor, positions: int) -> None:
    if rel is None:
        return
    check_float(op, "relative_bias", rel)
    check_device(op, "relative_bias", rel, q, like="q")
    heads = q.shape[-2] if q.dim() == 3 else q.shape[1]
    if rel.dim() != 2 or rel.shape[0] != heads or rel.shape[1] % 2 == 0 or (rel.shape[1] + 1) // 2 < positions:
        raise ValueError(f"fastbert.ops.{op}: relative_bias must be [heads, 2n - 1] with heads = {heads} and "
                         f"n >= {positions}, got shape {tuple(rel.shape)}")


def _check_window(op: str, window: Optional[int]) -> int:
    """window as the kernels take it: >= 0, or -1 for every key."""
    if window is None:
        return -1
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"fastbert.ops.{op}: window must be an int >= 0 (keys on either side), got {window!r}")
    return window


@functools.lru_cache(maxsize=32)
def rotary_tables(base: float, head_dim: int, positions: int, device: str):
    # a pure function of its arguments, never written to: nothing can make an entry stale. Built as
    # normal tensors even when the first call comes under torch.inference_mode(): an inference
    # tensor cached here could never be saved for a backward later
    with torch.inference_mode(False):
        return reference.rotary_tables(base, head_dim, positions, torch.device(device))


def _as_bool_mask(op: str, attention_mask: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    check_tensor(op, "attention_mask", attention_mask)
    batch, seq = q.shape[0], q.shape[2]
    if tuple(attention_mask.shape) != (batch, seq):
        raise ValueError(
            f"fastbert.ops.{op}: attention_mask has shape {tuple(attention_mask.shape)}; it must be "
            f"[batch, seq] = ({batch}, {seq}) for q of shape {tuple(q.shape)}"
        )
    check_device(op, "attention_mask", attention_mask, q, like="q")
    return check_mask(op, "attention_mask", attention_mask).contiguous()


# --------------------------------------------------------------------------------------------
# the "torch" backend


def _torch_attention(q, k, v, mask, scale, dropout_p, seed, return_mask, rope=(None, None), window=-1, rel_bias=None):
    if rope[0] is not None:
        q, k = (reference.rotate(t, *rope) for t in (q, k))
    keep = None
    if dropout_p > 0 or window >= 0 or rel_bias is not None:  # the reference layer: fastbert's dropout rule
        if dropout_p > 0:
            starts = reference.mask_starts(mask) if mask is not None else None
            keep = torch_keep_mask(seed, q.shape[0], q.shape[1], q.shape[2], dropout_p, starts).to(q.device)
        bias = None if rel_bias is None else layouts.relative_bias_matrix(rel_bias, q.shape[2])
        out = reference.attention(q, k, v, mask, dropout_p, scale, keep_mask=keep, window=window if window >= 0 else None,
                                  bias=bias)
    elif mask is None:
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    else:
        # padded queries may see every key: their rows stay finite (SDPA gives NaN for a row with no
        # key at all), and are zeroed below; real queries see the real keys only
        allowed = mask[:, None, None, :] | ~mask[:, None, :, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
        out = out * mask[:, None, :, None].to(out.dtype)
    if return_mask:
        if keep is None:
            keep = torch.ones(q.shape[:3] + (q.shape[2],), dtype=torch.bool, device=q.device)
        return out, keep
    return out


# --------------------------------------------------------------------------------------------
# the functional API


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, *,
              dropout_p: float = 0.0, scale: Optional[float] = None, backend: Optional[str] = None,
              seed: Optional[int] = None, generator: Optional[torch.Generator] = None, return_dropout_mask: bool = False,
              rotary_base: Optional[float] = None, window: Optional[int] = None,
              relative_bias: Optional[torch.Tensor] = None):
    """softmax(q k^T * scale, padded keys masked) v, one fused pass (see the module docstring).

    q, k, v: [batch, heads, seq, head_dim], one dtype (float32/float16/bfloat16), any strides.
    attention_mask: [batch, seq] (bool, integer, or float 0/1), 1/True = real token, or None.
    dropout_p: on the attention probabilities; the mask is a function of `seed` (an int in
    [0, 2**63); drawn from torch's RNG, or `generator`, when None). scale: default 1/sqrt(head_dim).
    return_dropout_mask: also return the bool [batch, heads, seq, seq] keep-mask the backend used
    (all True without dropout), for checking a backend against the reference.
    rotary_base: rotate q and k by the rotary embedding of this base (transformers' default rope,
    fastbert.reference.rotary) as the kernel reads them, position = row index; None: no rotation.
    window: local attention, each query sees the keys at most `window` rows away on either side
    (ModernBERT's local layers: 64); the blocks past the window are never computed, so the cost
    grows with the window, not the sequence. None: every key.
    relative_bias: [heads, 2n - 1] (n >= seq), differentiable: entry j - i + n - 1 of head h is added
    to the scaled score of query i and key j (MPNet's relative position bias,
    fastbert.layouts.relative_bias of its bucket table), read by distance inside the kernel,
    never spread to [heads, seq, seq].
    Returns [batch, heads, seq, head_dim] in q's dtype (zeros at padded query positions).
    """
    op = "attention"
    _check_qkv(op, q, k, v, 4, "[batch, heads, seq, head_dim]")
    backend = fb_backend.resolve(backend, q)
    scale = _check_options(op, backend, q.shape[-1], dropout_p, scale, q.shape[2])
    mask = None if attention_mask is None else _as_bool_mask(op, attention_mask, q)
    seed_t = op_seed(seed, generator) if dropout_p > 0 else None
    rope = _rope(op, rotary_base, backend, q.shape[-1], q.shape[2], q.device)
    reach = _check_window(op, window)
    _check_relative(op, relative_bias, q, q.shape[2])
    if backend == "torch" or q.numel() == 0:
        return _torch_attention(q, k, v, mask, scale, float(dropout_p), seed_t, return_dropout_mask, rope, reach,
                                relative_bias)
    out, keep = run_fused(q, k, v, mask, None, None, scale, dropout_p, seed_t, return_dropout_mask, rope, reach,
                           relative_bias, backend, q.shape[:3] + (q.shape[2],))
    return (out, keep) if return_dropout_mask else out


def check_cu_seqlens(op: str, cu_seqlens, max_seqlen, q: torch.Tensor, bounds: bool = True) -> None:
    """cu_seqlens and max_seqlen checked for q's packed rows: type, shape and device, and with
    bounds (one read of cu_seqlens on the host) its values."""
    check_tensor(op, "cu_seqlens", cu_seqlens)
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"fastbert.ops.{op}: cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"fastbert.ops.{op}: cu_seqlens must be 1-D [batch + 1], got shape {tuple(cu_seqlens.shape)}")
    check_device(op, "cu_seqlens", cu_seqlens, q, like="q")
    if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen < 0:
        raise TypeError(f"fastbert.ops.{op}: max_seqlen must be an int >= 0, got {max_seqlen!r}")
    if not bounds:
        return
    cu = cu_seqlens.tolist()  # one small copy: the bounds are checked on the host
    if cu[0] != 0 or cu[-1] != q.shape[0]:
        raise ValueError(
            f"fastbert.ops.{op}: cu_seqlens must start at 0 and end at total_tokens = {q.shape[0]}, "
            f"got {cu[0]} ... {cu[-1]}"
        )
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
    if any(n < 0 for n in lengths):
        raise ValueError(f"fastbert.ops.{op}: cu_seqlens must be non-decreasing, got {cu}")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(
            f"fastbert.ops.{op}: max_seqlen is {max_seqlen} but sequence {lengths.index(max(lengths))} "
            f"has {max(lengths)} tokens"
        )


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, *,
                     dropout_p: float = 0.0, scale: Optional[float] = None, backend: Optional[str] = None,
                     seed: Optional[int] = None, generator: Optional[torch.Generator] = None,
                     return_dropout_mask: bool = False, rotary_base: Optional[float] = None,
                     window: Optional[int] = None, relative_bias: Optional[torch.Tensor] = None,
                     validate: bool = True):
    """attention over packed sequences (see the module docstring for the shapes).

    Each sequence attends within itself only. The same options as `attention`; the dropout mask
    of sequence b is the one `attention` draws for row b of a right-padded batch, so the two entry
    points agree. return_dropout_mask: also return bool [batch, heads, max_seqlen, max_seqlen].
    rotary_base, window, relative_bias: as for `attention`, a token's position its index in its sequence
    (relative_bias: n >= max_seqlen).
    validate: read cu_seqlens on the host to check its bounds against max_seqlen and the tokens (on
    a GPU, a wait for the device); False for cu_seqlens that fastbert.ops.unpad gave, as a model
    passes its own to every layer (its type, shape and device are checked either way).
    """
    op = "varlen_attention"
    _check_qkv(op, q, k, v, 3, "[total_tokens, heads, head_dim]")
    check_cu_seqlens(op, cu_seqlens, max_seqlen, q, bounds=validate)
    backend = fb_backend.resolve(backend, q)
    scale = _check_options(op, backend, q.shape[-1], dropout_p, scale, max_seqlen)
    seed_t = op_seed(seed, generator) if dropout_p > 0 else None
    batch = cu_seqlens.shape[0] - 1
    rope = _rope(op, rotary_base, backend, q.shape[-1], max_seqlen, q.device)
    reach = _check_window(op, window)
    _check_relative(op, relative_bias, q, max_seqlen)
    if backend == "torch" or q.numel() == 0:
        return _torch_varlen(q, k, v, cu_seqlens, max_seqlen, scale, float(dropout_p), seed_t, return_dropout_mask,
                             rope, reach, relative_bias)
    out, keep = run_fused(q, k, v, None, cu_seqlens.contiguous(), max_seqlen, scale, dropout_p, seed_t,
                           return_dropout_mask, rope, reach, relative_bias, backend,
                           (batch, q.shape[1], max_seqlen, max_seqlen))
    return (out, keep) if return_dropout_mask else out


def _torch_varlen(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, seed, return_mask, rope, window, rel_bias):
    """The packed batch padded to max_seqlen, through the padded torch path, and packed again."""
    padded, mask, indices = heads_padded((q, k, v), cu_seqlens, max_seqlen)
    res = _torch_attention(*padded, mask, scale, dropout_p, seed, return_mask, rope, window, rel_bias)
    out, keep = res if return_mask else (res, None)
    return (heads_packed(out, indices), keep) if return_mask else heads_packed(out, indices)
