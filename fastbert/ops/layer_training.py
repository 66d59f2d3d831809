"""An encoder layer's training step on the Triton kernels as one autograd node, its backward
written out: the post-LN layer (BERT's, and every family on its layer)

    qkv = x Wqkv^T + bqkv -> attention (joined QKV rows) -> a = ctx Wo^T + bo
    h1 = layer_norm(dropout(a) + x) -> i = h1 Wi^T -> g = gelu(i + bi) -> o = g Wf^T + bf
    y = layer_norm(dropout(o) + h1)

and the pre-LN layer (ModernBERT's), whose residual stream enters as h + delta and leaves as (s2, f):

    s1 = delta + h, n1 = layer_norm(s1) (layer 0: s1 = n1 = h) -> qkv = n1 Wqkv^T -> attention
    (rotary, window) -> o = ctx Wo^T -> s2 = o + s1, n2 = layer_norm(s2) -> u = n2 Wi^T
    -> g = geglu(u) -> f = g Wf^T

The same GEMMs and kernels the separate ops run, in the same order, with none of their per-op
costs: one autograd node for the layer instead of a dozen, each with its checks, its saved-tensor
bookkeeping and its engine step; residual gradients added by the GEMMs that produce the other half
(addmm's beta = 1) or by the LayerNorm kernels (their dsum) instead of by the engine; the QKV
weight's gradient one GEMM whose rows are the three projections'. On a GPU a training step at
small batches waits on the host (benchmarks/bench_host.py counts it on any CPU); the kernels are
the ones whose results the op tests hold to the reference, and tests/ops/test_layer_training.py
holds both nodes to the separate ops, every gradient included.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

from fastbert import backend as fb_backend
from fastbert.kernels import empty_parts
from fastbert.ops.attention import TRITON_HEAD_DIMS, joined_backward, joined_forward, joined_lse_shape, rotary_for
from fastbert.ops.linear import rows_forward

Tensor = torch.Tensor


class TrainingLayer(NamedTuple):
    """What the node takes of a layer besides its tensors: heads, the two LayerNorms' eps, the
    GELU form ("none" or "tanh"), the three dropout probabilities (attention, after the output
    projection, after the feed-forward) and their seeds (ints, or None where the probability is 0)."""

    heads: int
    eps: Tuple[float, float]
    approximate: str
    dropout: Tuple[float, float, float]
    seeds: Tuple[Optional[int], Optional[int], Optional[int]]


def applies(hidden: Tensor, backend: Optional[str], head_dim: int) -> bool:
    """Whether the node runs this layer: the Triton backend, a gradient to come, outside
    torch.compile (which traces the separate ops) and autocast (whose casts they make), a head dim
    the kernels take."""
    return (fb_backend.resolve(backend, hidden) == "triton" and torch.is_grad_enabled()
            and not torch.compiler.is_compiling() and not torch.is_autocast_enabled(hidden.device.type)
            and head_dim in TRITON_HEAD_DIMS and hidden.numel() > 0)


def _rows(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1])


def _linear_grads(dy: Tensor, x: Tensor, w: Tensor, has_bias: bool, need_w: bool):
    """(dx, dw or None, db or None) of x w^T + b."""
    return dy.mm(w), dy.t().mm(x) if need_w else None, dy.sum(0) if has_bias else None


class _LayerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layout, opts: TrainingLayer, rel, qkv_w, qkv_b, out_w, out_b, n1_w, n1_b, in_w, in_b, f_w, f_b,
                n2_w, n2_b, *qkv_parts):
        shape, mask, cu, max_seqlen = layout
        ln = fb_backend.impl("triton", "layer_norm")
        gelu = fb_backend.impl("triton", "bias_gelu")
        p_attn, p1, p2 = opts.dropout
        s_attn, s1, s2 = opts.seeds
        xr = _rows(x)
        qkv = rows_forward(xr, qkv_w, qkv_b, "triton")
        d = shape[-1] // opts.heads
        # what the step writes besides its products' outputs, from one allocation: all of it is saved
        # for the backward or is the output (the next layer's saved input), so it dies together
        R, H, F = xr.shape[0], xr.shape[1], in_w.shape[0]
        stats = ((R,), torch.float32)
        parts = [(shape, x.dtype), ((R, H), x.dtype), stats, stats, ((R, F), x.dtype), ((R, H), x.dtype), stats,
                 stats]
        if rel is None:
            parts.append((joined_lse_shape(shape, opts.heads, cu is not None), torch.float32))
        rows, h1, mean1, rstd1, g, y, mean2, rstd2, *lse_out = empty_parts(parts, x.device)
        rows, lse = joined_forward(qkv, shape, opts.heads, mask, cu, max_seqlen, 1.0 / math.sqrt(d), p_attn, s_attn,
                                   (None, None), -1, rel, rows, *lse_out)
        rows = _rows(rows)
        a = rows_forward(rows, out_w, out_b, "triton")
        ln.add_layer_norm_forward(a, xr, n1_w, n1_b, opts.eps[0], p1, s1, out=h1, stats_out=(mean1, rstd1))
        i = rows_forward(h1, in_w, None, "triton")
        gelu.bias_gelu_forward(i, in_b, opts.approximate, out=g)
        o = rows_forward(g, f_w, f_b, "triton")
        ln.add_layer_norm_forward(o, h1, n2_w, n2_b, opts.eps[1], p2, s2, out=y, stats_out=(mean2, rstd2))
        ctx.save_for_backward(xr, qkv, rows, lse, a, h1, mean1, rstd1, i, g, o, mean2, rstd2, mask, cu, rel,
                              qkv_w, out_w, n1_w, in_w, in_b, f_w, n2_w)
        ctx.layout, ctx.opts, ctx.x_shape = (shape, max_seqlen), opts, x.shape
        ctx.parts = [p.shape[0] for p in qkv_parts[:3]]  # the weights' rows (the biases': the same)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        (xr, qkv, rows, lse, a, h1, mean1, rstd1, i, g, o, mean2, rstd2, mask, cu, rel,
         qkv_w, out_w, n1_w, in_w, in_b, f_w, n2_w) = ctx.saved_tensors
        shape, max_seqlen = ctx.layout
        opts = ctx.opts
        ln = fb_backend.impl("triton", "layer_norm")
        gelu = fb_backend.impl("triton", "bias_gelu")
        p_attn, p1, p2 = opts.dropout
        s_attn, s1, s2 = opts.seeds
        dy = _rows(dy).contiguous()
        R, H, F = xr.shape[0], xr.shape[1], i.shape[1]
        # the backward's gradients and scratch from one allocation (none of it leaves the step: the
        # input's gradient and every parameter's are the GEMMs' and the sums' own outputs); the
        # gradients of the two biased products' outputs side by side, so that one sum gives both biases
        ln_partials = (ln.backward_partials_shape(R, H, xr.device), torch.float32)
        parts = [((2, R, H), xr.dtype), ((R, H), xr.dtype), ln_partials, ((R, F), xr.dtype),
                 (gelu.backward_partials_shape(R, F, xr.device), torch.float32), ((R, H), xr.dtype), ln_partials,
                 (qkv.shape, qkv.dtype)]
        if rel is None:
            parts.append((lse.shape, torch.float32))
        d_out, dh1, partials2, di, gelu_partials, dx, partials1, dqkv, *delta = empty_parts(parts, xr.device)
        do, da = d_out.unbind(0)
        # y = LN2(dropout(o) + h1): do, and h1's gradient through the residual
        _, _, dn2_w, dn2_b = ln.add_layer_norm_backward(dy, o, h1, n2_w, mean2, rstd2, p2, s2, out=(do, dh1),
                                                        partials=partials2)
        need = ctx.needs_input_grad  # a frozen weight's product is skipped
        dg, df_w, _ = _linear_grads(do, g, f_w, False, need[12])
        _, din_b = gelu.bias_gelu_backward(dg, i, in_b, opts.approximate, out=di, partials=gelu_partials)
        din_w = di.t().mm(h1) if need[10] else None
        dh1 = torch.addmm(dh1, di, in_w)  # through the feed-forward, added to the residual's
        # h1 = LN1(dropout(a) + x)
        _, _, dn1_w, dn1_b = ln.add_layer_norm_backward(dh1, a, xr, n1_w, mean1, rstd1, p1, s1, out=(da, dx),
                                                        partials=partials1)
        drows, dout_w, _ = _linear_grads(da, rows, out_w, False, need[6])
        df_b, dout_b = d_out.sum(1).unbind(0)  # both biases in one reduction
        d = shape[-1] // opts.heads
        dqkv, drel = joined_backward(drows, qkv, rows, lse, shape, opts.heads, mask, cu, max_seqlen, 1.0 / math.sqrt(d),
                                     p_attn, s_attn, (None, None), -1, rel, dqkv, *delta)
        dqkv_b = dqkv.sum(0)
        parts_w = dqkv.t().mm(xr).split(ctx.parts) if any(need[16:19]) else (None,) * 3
        dx = torch.addmm(dx, dqkv, qkv_w)  # through the projections, added to the residual's
        parts_b = dqkv_b.split(ctx.parts)
        return (dx.view(ctx.x_shape), None, None, drel if ctx.needs_input_grad[3] else None,
                None, None, dout_w, dout_b, dn1_w, dn1_b, din_w, din_b, df_w, df_b, dn2_w, dn2_b, *parts_w, *parts_b)


def layer_training_forward(hidden: Tensor, shape, mask: Optional[Tensor], cu_seqlens: Optional[Tensor],
                           max_seqlen: Optional[int], rel: Optional[Tensor], opts: TrainingLayer,
                           qkv: Tuple[Tensor, Tensor], qkv_parts: Tuple[Tensor, ...], out: Tuple[Tensor, Tensor],
                           norm1: Tuple[Tensor, Tensor], ffn_in: Tuple[Tensor, Tensor], ffn_out: Tuple[Tensor, Tensor],
                           norm2: Tuple[Tensor, Tensor]) -> Tensor:
    """The layer's output for hidden (packed [tokens, width] with cu_seqlens, max_seqlen; or padded
    [batch, seq, width] with mask, bool [batch, seq] or None; shape: hidden's) through the node.
    qkv: the joined QKV (weight, bias), whose row slices the parameters qkv_parts (the three weights,
    then the three biases: joined.share_storage's) are, so that each gets its slice of the gradient;
    the others (weight, bias) pairs; rel: MPNet's relative position bias [heads, 2n - 1] or None."""
    return _LayerFunction.apply(hidden, (tuple(shape), mask, cu_seqlens, max_seqlen), opts, rel, *qkv, *out, *norm1,
                                *ffn_in, *ffn_out, *norm2, *qkv_parts)


class PreNormLayer(NamedTuple):
    """What the pre-LN node takes of a layer besides its tensors: heads, the two LayerNorms' eps
    (the first unused in layer 0, which has no attention norm), the GeGLU's GELU form, the rotary
    embedding's base and the local window (-1: every key)."""

    heads: int
    eps: Tuple[float, float]
    approximate: str
    rotary_base: float
    window: int


class _PreNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, delta, layout, opts: PreNormLayer, an_w, an_b, qkv_w, qkv_b, o_w, o_b, mn_w, mn_b, i_w, i_b,
                f_w, f_b):
        shape, mask, cu, max_seqlen = layout
        packed = cu is not None
        ln = fb_backend.impl("triton", "layer_norm")
        hr = _rows(h)
        first = delta is None
        R, H = hr.shape
        d = shape[-1] // opts.heads
        # what the step writes besides its products' outputs, from one allocation: saved for the
        # backward, or an output (s2, the next layer's saved stream), so it dies together
        stats = ((R,), torch.float32)
        parts = [(shape, h.dtype), (joined_lse_shape(shape, opts.heads, packed), torch.float32), ((R, H), h.dtype),
                 ((R, H), h.dtype), stats, stats, ((R, i_w.shape[0] // 2), h.dtype)]
        if not first:
            parts += [((R, H), h.dtype), ((R, H), h.dtype), stats, stats]
        rows, lse, n2, s2, mean2, rstd2, g, *first_norm = empty_parts(parts, h.device)
        if first:  # layer 0: no attention norm, the stream is the embeddings' output
            s1, n1, mean1, rstd1 = hr, hr, None, None
            dr = None
        else:
            dr = _rows(delta)
            n1, s1, mean1, rstd1 = first_norm
            ln.add_layer_norm_forward(dr, hr, an_w, an_b, opts.eps[0], 0.0, None, True, out=n1, sum_out=s1,
                                      stats_out=(mean1, rstd1))
        qkv = rows_forward(n1, qkv_w, qkv_b, "triton")
        rope = rotary_for(opts.rotary_base, d, max_seqlen if packed else shape[1], h.device)
        rows, lse = joined_forward(qkv, shape, opts.heads, mask, cu, max_seqlen, 1.0 / math.sqrt(d), 0.0, None, rope,
                                   opts.window, None, rows, lse)
        rows = _rows(rows)
        o = rows_forward(rows, o_w, o_b, "triton")
        ln.add_layer_norm_forward(o, s1, mn_w, mn_b, opts.eps[1], 0.0, None, True, out=n2, sum_out=s2,
                                  stats_out=(mean2, rstd2))
        u = rows_forward(n2, i_w, i_b, "triton")
        fb_backend.impl("triton", "geglu").geglu_forward(u, opts.approximate, out=g)
        f = rows_forward(g, f_w, f_b, "triton")
        ctx.save_for_backward(dr, hr, n1, mean1, rstd1, s1, qkv, rows, lse, o, n2, mean2, rstd2, u, g, mask, cu,
                              an_w, qkv_w, o_w, mn_w, i_w, f_w, *rope)
        ctx.layout, ctx.opts, ctx.shape = (shape, max_seqlen), opts, h.shape
        ctx.biases = tuple(t is not None for t in (an_b, qkv_b, o_b, mn_b, i_b, f_b))
        return s2.view(h.shape), f.view(h.shape)

    @staticmethod
    def backward(ctx, ds2, df):
        (dr, hr, n1, mean1, rstd1, s1, qkv, rows, lse, o, n2, mean2, rstd2, u, g, mask, cu,
         an_w, qkv_w, o_w, mn_w, i_w, f_w, cos, sin) = ctx.saved_tensors
        shape, max_seqlen = ctx.layout
        opts, need = ctx.opts, ctx.needs_input_grad
        has_an_b, has_qkv_b, has_o_b, has_mn_b, has_i_b, has_f_b = ctx.biases
        ln = fb_backend.impl("triton", "layer_norm")
        zeros = torch.zeros(hr.shape, dtype=hr.dtype, device=hr.device) if ds2 is None or df is None else None
        ds2 = zeros if ds2 is None else _rows(ds2).contiguous()
        df = zeros if df is None else _rows(df).contiguous()
        R, H = hr.shape
        # the backward's gradients and scratch from one allocation; what leaves it (the stream's and
        # delta's gradients) goes on to the layer before, whose backward comes next
        ln_partials = (ln.backward_partials_shape(R, H, hr.device, with_dsum=True), torch.float32)
        parts = [(u.shape, u.dtype), ((R, H), hr.dtype), ((R, H), hr.dtype), ln_partials, (qkv.shape, qkv.dtype),
                 (lse.shape, torch.float32)]
        if dr is not None:
            parts += [((R, H), hr.dtype), ((R, H), hr.dtype), ln_partials]
        du, do, ds1, partials2, dqkv, delta, *first_norm = empty_parts(parts, hr.device)
        dg, df_w, df_b = _linear_grads(df, g, f_w, has_f_b, need[14])
        fb_backend.impl("triton", "geglu").geglu_backward(dg, u, opts.approximate, out=du)
        dn2, di_w, di_b = _linear_grads(du, n2, i_w, has_i_b, need[12])
        # s2 = o + s1, n2 = LN(s2): the stream's own gradient ds2 joins the norm's in the kernel
        _, _, dmn_w, dmn_b = ln.add_layer_norm_backward(dn2, o, s1, mn_w, mean2, rstd2, 0.0, None, dsum=ds2,
                                                        out=(do, ds1), partials=partials2)
        drows, do_w, do_b = _linear_grads(do, rows, o_w, has_o_b, need[8])
        d = shape[-1] // opts.heads
        dqkv, _ = joined_backward(drows, qkv, rows, lse, shape, opts.heads, mask, cu, max_seqlen, 1.0 / math.sqrt(d),
                                  0.0, None, (cos, sin), opts.window, None, dqkv, delta)
        dqkv_w = dqkv.t().mm(n1) if need[6] else None
        dqkv_b = dqkv.sum(0) if has_qkv_b else None
        if dr is None:  # layer 0: n1 = s1 = h
            dh, ddelta, dan_w, dan_b = torch.addmm(ds1, dqkv, qkv_w), None, None, None
        else:
            dn1 = dqkv.mm(qkv_w)
            ddelta, dh, partials1 = first_norm
            _, _, dan_w, dan_b = ln.add_layer_norm_backward(dn1, dr, hr, an_w, mean1, rstd1, 0.0, None, dsum=ds1,
                                                            out=(ddelta, dh), partials=partials1)
            ddelta = ddelta.view(ctx.shape)
        return (dh.view(ctx.shape), ddelta, None, None, dan_w, dan_b if has_an_b else None, dqkv_w, dqkv_b, do_w,
                do_b, dmn_w, dmn_b if has_mn_b else None, di_w, di_b, df_w, df_b)


def prenorm_training_forward(h: Tensor, delta: Optional[Tensor], shape, mask: Optional[Tensor],
                             cu_seqlens: Optional[Tensor], max_seqlen: Optional[int], opts: PreNormLayer,
                             attn_norm: Tuple[Optional[Tensor], Optional[Tensor]], qkv: Tuple[Tensor, Optional[Tensor]],
                             out: Tuple[Tensor, Optional[Tensor]], mlp_norm: Tuple[Tensor, Optional[Tensor]],
                             ffn_in: Tuple[Tensor, Optional[Tensor]], ffn_out: Tuple[Tensor, Optional[Tensor]]
                             ) -> Tuple[Tensor, Tensor]:
    """(s2, f), a pre-LN layer's residual stream and feed-forward output (ModernBertEncoderLayer's
    (h', delta')), through the node: h (+ delta, the previous layer's f; None before layer 0, whose
    attn_norm is then (None, None)) packed [tokens, width] with cu_seqlens, max_seqlen, or padded
    [batch, seq, width] with mask (bool [batch, seq] or None); each (weight, bias) pair's bias may
    be None."""
    return _PreNormFunction.apply(h, delta, (tuple(shape), mask, cu_seqlens, max_seqlen), opts, *attn_norm, *qkv,
                                  *out, *mlp_norm, *ffn_in, *ffn_out)
