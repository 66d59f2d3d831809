"""One post-LN encoder layer (BERT's and its family's) for inference, in one call:

    qkv = hidden @ Wqkv^T + bqkv                      one GEMM for the three projections
    ctx = attention(q, k, v)                          padding mask, or packed sequences; MPNet's relative bias
    h1  = layer_norm(ctx @ Wo^T + bo + hidden)        fused add + LayerNorm
    out = layer_norm(gelu(h1 @ Wi^T + bi) @ Wf^T + bf + h1)

    encoder_layer(hidden, weights, *, heads, eps, approximate="none", attention_mask=None,
                  cu_seqlens=None, max_seqlen=None, relative_bias=None, backend=None)
        hidden:  [batch, seq, hidden] (attention_mask [batch, seq] or None) or the packed rows
                 [tokens, hidden] (cu_seqlens int32 [batch + 1], max_seqlen)
        weights: LayerWeights (the twelve tensors, in the order of its fields)
        returns: the layer's output, hidden's shape and dtype

It runs the kernels the separate ops run (fastbert.ops.linear's measured GEMM paths, the fused
attention, add_layer_norm and bias_gelu), called one after the other after one check of the
arguments; on the C++ kernels in fp32, once every product's GEMM path is measured (the extension
calls every fp32 path: addmm, dot, onednn, onednn_packed, mkl_packed), the whole layer is one call
of the extension (csrc/encoder_layer.cpp: the GIL released, no Python between the kernels), which a
model calls for its own layers through model_layer, without this op's checks of arguments it made
itself. A layer made of the separate ops pays each op's checks, backend choice and autograd test,
about 20 us of Python apiece on the CPU, and the model's Python between them: for one sequence of
20 tokens that was about a fifth of the forward; for MiniLM's batches of 33 short texts, with
products on oneDNN's or MKL's paths, the forward ran 8% slower than as one call. The result is bit
for bit that of the separate ops, on every backend (tests/ops/test_encoder_layer.py). The weights
are arguments: nothing is derived from them or kept between calls, so nothing can go stale.

Inference only: an input that requires a gradient, with grad mode on, is an error (train with the
separate ops, which the model does). Under autocast the layer runs through the separate ops, which
cast as autocast does.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

from fastbert import backend as _backend
from fastbert.ops import gemm
from fastbert.ops.attention import attention, check_cu_seqlens, varlen_attention
from fastbert.ops.attention_fused import attention_fwd, varlen_attention_fwd
from fastbert.ops.bias_gelu import bias_gelu, bias_gelu_fwd
from fastbert.ops.checks import check_approximate, check_device, check_float, check_mask, check_tensor
from fastbert.ops.layer_norm import MAX_HIDDEN, add_layer_norm, add_layer_norm_fwd
from fastbert.ops.linear import linear, rows_forward

Tensor = torch.Tensor
OP = "encoder_layer"


class LayerWeights(NamedTuple):
    """The parameters of one post-LN encoder layer (hidden H, intermediate F)."""

    qkv_weight: Tensor      # [3H, H]: query, key and value stacked
    qkv_bias: Tensor        # [3H]
    out_weight: Tensor      # [H, H]: the attention's output projection
    out_bias: Tensor        # [H]
    norm1_weight: Tensor    # [H]: the LayerNorm after the attention
    norm1_bias: Tensor      # [H]
    ffn_in_weight: Tensor   # [F, H]
    ffn_in_bias: Tensor     # [F]
    ffn_out_weight: Tensor  # [H, F]
    ffn_out_bias: Tensor    # [H]
    norm2_weight: Tensor    # [H]: the LayerNorm after the feed-forward block
    norm2_bias: Tensor      # [H]


def _check(hidden: Tensor, w: LayerWeights, heads: int, packed: bool) -> None:
    check_float(OP, "hidden", hidden)
    if hidden.dim() != (2 if packed else 3):
        layout = "[tokens, hidden] with cu_seqlens" if packed else "[batch, seq, hidden]"
        raise ValueError(f"fastbert.ops.{OP}: hidden must be {layout}, got shape {tuple(hidden.shape)}")
    h = hidden.shape[-1]
    if not isinstance(heads, int) or heads < 1 or h % heads:
        raise ValueError(f"fastbert.ops.{OP}: heads must be an int >= 1 dividing the hidden size {h}, got {heads!r}")
    if h > MAX_HIDDEN:
        raise ValueError(f"fastbert.ops.{OP}: hidden size {h} is above the supported maximum {MAX_HIDDEN}")
    f = w.ffn_in_weight.shape[0] if isinstance(w.ffn_in_weight, Tensor) and w.ffn_in_weight.dim() == 2 else -1
    shapes = {"qkv_weight": (3 * h, h), "qkv_bias": (3 * h,), "out_weight": (h, h), "out_bias": (h,),
              "norm1_weight": (h,), "norm1_bias": (h,), "ffn_in_weight": (f, h), "ffn_in_bias": (f,),
              "ffn_out_weight": (h, f), "ffn_out_bias": (h,), "norm2_weight": (h,), "norm2_bias": (h,)}
    for name, t in zip(LayerWeights._fields, w):
        check_float(OP, name, t)
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"fastbert.ops.{OP}: {name} has shape {tuple(t.shape)}; for hidden size {h} it must be "
                             f"{shapes[name]}")
        if t.dtype != hidden.dtype and not (name.startswith("norm") and t.dtype == torch.float32):
            raise TypeError(f"fastbert.ops.{OP}: {name} has dtype {t.dtype} but hidden has dtype {hidden.dtype}")
        check_device(OP, name, t, hidden, like="hidden")
    if torch.is_grad_enabled() and (hidden.requires_grad or any(t.requires_grad for t in w)):
        raise RuntimeError(f"fastbert.ops.{OP} runs inference only, and an input requires a gradient: run it under "
                           "torch.no_grad() / torch.inference_mode(), or train with the separate ops")


def _padding_mask(attention_mask, hidden: Tensor) -> Tensor:
    """attention_mask [batch, seq] as the bool mask the attention kernels take."""
    check_tensor(OP, "attention_mask", attention_mask)
    if tuple(attention_mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"fastbert.ops.{OP}: attention_mask has shape {tuple(attention_mask.shape)}; it must be "
                         f"[batch, seq] = {tuple(hidden.shape[:2])}")
    check_device(OP, "attention_mask", attention_mask, hidden, like="hidden")
    return check_mask(OP, "attention_mask", attention_mask).contiguous()


def encoder_layer(hidden: Tensor, weights: LayerWeights, *, heads: int, eps: Tuple[float, float],
                  approximate: str = "none", attention_mask: Optional[Tensor] = None,
                  cu_seqlens: Optional[Tensor] = None, max_seqlen: Optional[int] = None,
                  relative_bias: Optional[Tensor] = None, backend: Optional[str] = None) -> Tensor:
    """A post-LN encoder layer's output for `hidden` (see the module docstring). eps: the two
    LayerNorms' epsilons; approximate: the GELU form ("none": erf, "tanh"); relative_bias
    [heads, 2n - 1]: added to the scaled scores by distance, as ops.attention takes it."""
    weights = LayerWeights(*weights)
    packed = cu_seqlens is not None
    _check(hidden, weights, heads, packed)
    check_approximate(OP, approximate)
    backend = _backend.resolve(backend, hidden)
    if packed:
        if attention_mask is not None:
            raise ValueError(f"fastbert.ops.{OP}: give attention_mask (padded rows) or cu_seqlens (packed), not both")
        check_cu_seqlens(OP, cu_seqlens, max_seqlen, hidden)
        mask, positions = None, max_seqlen
    else:
        mask = None if attention_mask is None else _padding_mask(attention_mask, hidden)
        positions = hidden.shape[1]
    if relative_bias is not None:
        check_float(OP, "relative_bias", relative_bias)
        check_device(OP, "relative_bias", relative_bias, hidden, like="hidden")
        n2 = relative_bias.shape[-1]
        if relative_bias.dim() != 2 or relative_bias.shape[0] != heads or n2 % 2 == 0 or (n2 + 1) // 2 < positions:
            raise ValueError(f"fastbert.ops.{OP}: relative_bias must be [heads, 2n - 1] with heads = {heads} and "
                             f"n >= {positions}, got shape {tuple(relative_bias.shape)}")
    if backend == "torch" or torch.is_autocast_enabled(hidden.device.type) or hidden.numel() == 0:
        return _separate_ops(hidden, weights, heads, eps, approximate, mask, cu_seqlens, max_seqlen, relative_bias,
                             backend)
    return _fused(hidden, weights, heads, eps, approximate, mask, cu_seqlens, max_seqlen, relative_bias, backend)


# the GEMM paths the extension's whole layer runs (csrc/encoder_layer.cpp), by fastbert.ops.gemm's names
CPP_LAYER_PATHS = {"addmm": 0, "dot": 1, "onednn": 5, "onednn_packed": 6, "mkl_packed": 7}


def model_layer(hidden: Tensor, weights, heads: int, eps: Tuple[float, float], approximate: str,
                mask: Optional[Tensor], cu_seqlens: Optional[Tensor], max_seqlen: Optional[int],
                rel: Optional[Tensor], backend: Optional[str]) -> Optional[Tensor]:
    """The layer in one C++ call, with no check of its arguments: encoder_layer's, after its checks,
    and a model's for its own layers, whose parameters the extension's functions check as they run.
    None where that call does not apply (the caller then runs the kernels one by one, or calls
    encoder_layer): not float32 on the C++ kernels, a mask not yet the kernels' bool, a GEMM path not
    measured or not one it runs."""
    if (hidden.dtype != torch.float32 or hidden.numel() == 0 or (mask is not None and mask.dtype != torch.bool)
            or _backend.resolve(backend, hidden) != "cpp" or torch.compiler.is_compiling()):
        return None
    paths = gemm.layer_paths(hidden.numel() // hidden.shape[-1], (weights[0], weights[2], weights[6], weights[8]),
                             torch.float32, CPP_LAYER_PATHS)
    if paths is None:
        return None
    return _backend.cpp_function("encoder_layer_forward")(
        hidden, list(weights), paths, heads, float(eps[0]), float(eps[1]), approximate, key_mask=mask,
        cu_seqlens=cu_seqlens, max_seqlen=max_seqlen or 0, rel_bias=rel)


def _fused(hidden, w: LayerWeights, heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel, backend) -> Tensor:
    """The kernels of the separate ops, called straight: in one call of the extension (the GIL
    released, no Python between the kernels) once every product's GEMM path is measured and is one
    it runs, else one by one from here."""
    one_call = model_layer(hidden, w, heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel, backend)
    if one_call is not None:
        return one_call
    h = hidden.shape[-1]
    d = h // heads
    x = hidden.reshape(-1, h)
    if not x.is_contiguous():
        x = x.contiguous()
    qkv = rows_forward(x, w.qkv_weight, w.qkv_bias)
    extra = (None, None, -1, rel, backend)  # no rotary tables, no window
    if cu_seqlens is not None:
        q, k, v = qkv.view(-1, 3, heads, d).unbind(1)  # [tokens, heads, d] each
        ctx = varlen_attention_fwd(q, k, v, cu_seqlens.contiguous(), max_seqlen, 1.0 / math.sqrt(d), 0.0, None, False,
                                    *extra)[0].view(-1, h)
    else:
        bsz, seq = hidden.shape[:2]
        q, k, v = qkv.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # [batch, heads, seq, d]
        ctx = attention_fwd(q, k, v, mask, 1.0 / math.sqrt(d), 0.0, None, False, *extra)[0]
        ctx = ctx.transpose(1, 2).reshape(-1, h)
    attn = rows_forward(ctx, w.out_weight, w.out_bias)
    h1 = add_layer_norm_fwd(attn, x, w.norm1_weight.contiguous(), w.norm1_bias.contiguous(), float(eps[0]), 0.0, None,
                             backend)[0]
    inter = bias_gelu_fwd(rows_forward(h1, w.ffn_in_weight, None), w.ffn_in_bias.contiguous(), approximate, backend)
    out = rows_forward(inter, w.ffn_out_weight, w.ffn_out_bias)
    y = add_layer_norm_fwd(out, h1, w.norm2_weight.contiguous(), w.norm2_bias.contiguous(), float(eps[1]), 0.0, None,
                            backend)[0]
    return y.view(hidden.shape)


def _separate_ops(hidden, w: LayerWeights, heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel, backend):
    """The same layer through the public ops (the torch backend's path, and autocast's)."""
    h = hidden.shape[-1]
    d = h // heads
    qkv = linear(hidden, w.qkv_weight, w.qkv_bias)
    if cu_seqlens is not None:
        q, k, v = qkv.view(-1, 3, heads, d).unbind(1)
        ctx = varlen_attention(q, k, v, cu_seqlens, max_seqlen, backend=backend, relative_bias=rel).reshape(hidden.shape)
    else:
        bsz, seq = hidden.shape[:2]
        q, k, v = qkv.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = attention(q, k, v, mask, backend=backend, relative_bias=rel).transpose(1, 2).reshape(hidden.shape)
    h1 = add_layer_norm(linear(ctx, w.out_weight, w.out_bias), hidden, w.norm1_weight, w.norm1_bias, eps[0],
                        backend=backend)
    inter = bias_gelu(linear(h1, w.ffn_in_weight), w.ffn_in_bias, approximate, backend=backend)
    return add_layer_norm(linear(inter, w.ffn_out_weight, w.ffn_out_bias), h1, w.norm2_weight, w.norm2_bias, eps[1],
                          backend=backend)
