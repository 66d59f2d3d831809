"""How an encoder's layers run for inference: every route, in one place.

    encoder_layer(hidden, weights, *, heads, eps, ...)      the public op: one post-LN layer (checked)
    layer_forward(hidden, weights, ...)                     a model's own layer, unchecked: one C++ call,
                                                            else the kernels one by one, tried once
    prenorm_layer_forward(hidden, delta, weights, ...)       a pre-LN layer (ModernBERT's), the kernels one
                                                            by one
    encoder_stack(hidden, layers, ...)                      a model's float32 layers, all in one C++ call
    int8_encoder_stack(hidden, hq, layers, ...)             its int8 layers, all in one C++ call
    int8_linear(hq, ...)                                    an int8 linear layer (a layer's QKV projection)
    int8_glu_rows(hq, ...)                                  a gated feed-forward's input products and gate, int8 out
    int8_layer_rest(ctx, hidden, ...)                       a post-LN int8 layer after its attention
    int8_add_norm(hq, ...)                                  a pre-LN int8 layer's tail (ModernBERT's)
    GEMM_PATH_IDS                                           the GEMM paths the C++ layers run, by id

One post-LN encoder layer (BERT's and its family's):

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
arguments; on the C++ kernels in fp32, once every product's GEMM path is measured and is one the
extension runs (GEMM_PATH_IDS), the whole layer is one call of the extension
(csrc/encoder_layer.cpp: the GIL released, no Python between the kernels). A model's layers take
the same route without the checks (layer_forward; the extension's functions check what they read),
and a model's whole stack of layers is one call too (encoder_stack, int8_encoder_stack), bit for bit
the layers called one at a time. Each op's checks, backend choice and autograd test cost Python
time on every call, which for short inputs is a large share of a layer (benchmarks/RESULTS.md has
the figures). The result is bit for bit that of the separate ops, on every backend
(tests/ops/test_encoder.py). The weights are arguments: nothing is derived from them or kept
between calls, so nothing here can go stale (a model that keeps its layers' weight lists between
calls keeps them current itself: fastbert.model.stack_plan).

Inference only: an input that requires a gradient, with grad mode on, is an error (train with the
separate ops, which the model does). Under autocast the layer runs through the separate ops, which
cast as autocast does.
"""
from __future__ import annotations

import collections
import math
import threading
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from fastbert import backend as fb_backend
from fastbert.ops import cuda_stack, gemm
from fastbert.ops.attention import (
    attention,
    attention_fwd,
    check_cu_seqlens,
    inference_forward,
    rotary_for,
    varlen_attention,
    varlen_attention_fwd,
)
from fastbert.ops.bias_gelu import bias_gelu, bias_gelu_fwd
from fastbert.ops.checks import check_approximate, check_device, check_float, check_mask, check_tensor
from fastbert.ops.common import as_rows
from fastbert.ops.geglu import geglu_fwd
from fastbert.ops.int8 import (
    int8_add_layer_norm,
    int8_bias_gelu,
    int8_dequantize,
    int8_glu,
    int8_matmul,
    packed_epilogue,
    quantize_rows,
)
from fastbert.ops.layer_norm import MAX_HIDDEN, add_layer_norm, add_layer_norm_fwd, add_layer_norm_sum_fwd
from fastbert.ops.linear import linear, rows_forward
from fastbert.ops.padding import pad, unpad_indices

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



class PreNormLayerWeights(NamedTuple):
    """The parameters of one pre-LN encoder layer (ModernBERT's; hidden H, intermediate F). A bias
    or a norm may be None: none (ModernBERT's layer 0 has no attention norm, its norms and
    projections may have no bias)."""

    attn_norm_weight: Optional[Tensor]  # [H]: the LayerNorm before the attention
    attn_norm_bias: Optional[Tensor]
    qkv_weight: Tensor                  # [3H, H]
    qkv_bias: Optional[Tensor]
    out_weight: Tensor                  # [H, H]
    out_bias: Optional[Tensor]
    mlp_norm_weight: Tensor             # [H]: the LayerNorm before the feed-forward block
    mlp_norm_bias: Optional[Tensor]
    ffn_in_weight: Tensor               # [2F, H]: the GeGLU's input and gate
    ffn_in_bias: Optional[Tensor]
    ffn_out_weight: Tensor              # [H, F]
    ffn_out_bias: Optional[Tensor]


class Int8LayerWeights(NamedTuple):
    """The parameters of one post-LN encoder layer quantized to int8 (fastbert.model.quantize): each
    product's int8 weight ([out, in], or packed [out / 16, in / 4, 16, 4]), its per-channel float32
    scale and its float bias; the norms float."""

    qkv_weight: Tensor
    qkv_scale: Tensor
    qkv_bias: Tensor
    out_weight: Tensor
    out_scale: Tensor
    out_bias: Tensor
    norm1_weight: Tensor
    norm1_bias: Tensor
    ffn_in_weight: Tensor
    ffn_in_scale: Tensor
    ffn_in_bias: Tensor
    ffn_out_weight: Tensor
    ffn_out_scale: Tensor
    ffn_out_bias: Tensor
    norm2_weight: Tensor
    norm2_bias: Tensor


# The GEMM paths the extension's layers run (csrc/encoder_layer.cpp's GemmPath), by fastbert.ops.gemm's
# names, and the id each takes there: the one table of them (tests/ops/test_encoder.py checks it against
# the extension's gemm_path_ids()). A product on a path not here runs its layer from Python.
GEMM_PATH_IDS = {"addmm": 0, "dot": 1, "fastbert": 2, "int_mm": 3, "packed": 4, "onednn": 5, "onednn_packed": 6,
                 "mkl_packed": 7}
INT8_PATHS = ("fastbert", "int_mm", "packed")
FLOAT_LAYER_PATHS = {name: i for name, i in GEMM_PATH_IDS.items() if name not in INT8_PATHS}
INT8_LAYER_PATHS = {name: GEMM_PATH_IDS[name] for name in INT8_PATHS}


def inference_now() -> bool:
    """Whether a layer may take the inference routes now: grad mode off, not while torch.compile
    traces, no autocast (whose casts the separate ops make)."""
    return (not torch.is_grad_enabled() and not torch.compiler.is_compiling() and not torch.is_autocast_enabled("cpu")
            and not torch.is_autocast_enabled("cuda"))

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
    backend = fb_backend.resolve(backend, hidden)
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
    return layer_forward(hidden, weights, heads, eps, approximate, mask, cu_seqlens, max_seqlen, relative_bias, backend)


def layer_forward(hidden: Tensor, weights: Sequence[Tensor], heads: int, eps: Tuple[float, float], approximate: str,
                  mask: Optional[Tensor], cu_seqlens: Optional[Tensor], max_seqlen: Optional[int],
                  rel: Optional[Tensor], backend: Optional[str]) -> Tensor:
    """encoder_layer's result without its checks of the arguments: encoder_layer's route after
    them, and a model's for its own layers (the kernels check what they read). mask: bool [batch,
    seq] or None. On the C++ kernels in fp32 the layer is one call of the extension where every
    product's GEMM path is measured and is one it runs, else the kernels one by one from here; the
    separate ops on the torch backend, under autocast and for an empty input."""
    backend = fb_backend.resolve(backend, hidden)
    if backend == "torch" or torch.is_autocast_enabled(hidden.device.type) or hidden.numel() == 0:
        return separate_ops(hidden, LayerWeights(*weights), heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel,
                            backend)
    if backend == "cpp" and hidden.dtype == torch.float32 and not torch.compiler.is_compiling():
        paths = gemm.layer_paths(hidden.numel() // hidden.shape[-1], (weights[0], weights[2], weights[6], weights[8]),
                                 torch.float32, FLOAT_LAYER_PATHS)
        if paths is not None:
            return fb_backend.cpp_function("encoder_layer_forward")(
                hidden, list(weights), paths, heads, float(eps[0]), float(eps[1]), approximate, key_mask=mask,
                cu_seqlens=cu_seqlens, max_seqlen=max_seqlen or 0, rel_bias=rel)
    return _kernels(as_rows(hidden), hidden.shape, LayerWeights(*weights), heads, eps, approximate, mask, cu_seqlens,
                    max_seqlen, rel, backend).view(hidden.shape)


def layers_forward(hidden: Tensor, layers: Sequence[tuple], mask: Optional[Tensor], cu_seqlens: Optional[Tensor],
                   max_seqlen: Optional[int], rel: Optional[Tensor], backend: Optional[str],
                   keep_states: bool) -> List[Tensor]:
    """layer_forward of each of `layers` ((weights, heads, eps, GELU form) each, a model's kept
    reads of its layers, one backend setting for all) in turn on hidden -> [every layer's output]
    (keep_states) or [the last]. The route is decided once for the stack (the backend, autocast,
    an empty input), not at every layer: on Triton the kernels are then called straight."""
    backend = fb_backend.resolve(backend, hidden)
    outs = []
    if backend == "triton" and not torch.is_autocast_enabled(hidden.device.type) and hidden.numel() > 0:
        shape, x = hidden.shape, as_rows(hidden)  # the layers on rows, each state viewed back once

        def run_python() -> List[Tensor]:
            rows, out = x, []
            for w, heads, eps, approximate in layers:
                rows = _kernels(rows, shape, w, heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel, backend)
                if keep_states:
                    out.append(rows)
            return out if keep_states else [rows]

        launched = None if rel is not None else cuda_stack.stack(x, shape, layers, mask, cu_seqlens, max_seqlen,
                                                                 keep_states, run_python)
        return [t.view(shape) for t in (run_python() if launched is None else launched)]
    for w, heads, eps, approximate in layers:
        hidden = layer_forward(hidden, w, heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel, backend)
        if keep_states:
            outs.append(hidden)
    return outs if keep_states else [hidden]


def _kernels(x, shape, w: LayerWeights, heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel, backend) -> Tensor:
    """The kernels of the separate ops, called straight one after the other, on the rows x [rows,
    width] (contiguous) of a hidden state of shape `shape` -> the output rows. On Triton each writes
    over an input that dies with it and keeps nothing only a backward reads: the attention's output
    over its queries (the context is then the QKV rows' first third, no copy), each LayerNorm over
    its GEMM's output, the GELU over its own; no log-sum-exp, no LayerNorm statistics; the norms and
    the GELU through launches bound once (the kernel modules' *_inference). What the GPU's queue
    receives per layer is then the four GEMMs, the four kernels and nothing else."""
    qkv = rows_forward(x, w.qkv_weight, w.qkv_bias, backend)
    ctx = _attention(qkv, shape, heads, mask, cu_seqlens, max_seqlen, None, -1, rel, backend)
    h1 = _add_norm(rows_forward(ctx, w.out_weight, w.out_bias, backend), x, w.norm1_weight, w.norm1_bias, eps[0],
                   backend)
    inter = rows_forward(h1, w.ffn_in_weight, None, backend)
    if backend == "triton":
        fb_backend.impl(backend, "bias_gelu").bias_gelu_inference(inter, w.ffn_in_bias.contiguous(), approximate)
    else:
        inter = bias_gelu_fwd(inter, w.ffn_in_bias.contiguous(), approximate, backend)
    return _add_norm(rows_forward(inter, w.ffn_out_weight, w.ffn_out_bias, backend), h1, w.norm2_weight,
                     w.norm2_bias, eps[1], backend)


def _attention(qkv: Tensor, shape, heads: int, mask, cu_seqlens, max_seqlen, rope, window: int, rel,
               backend: str) -> Tensor:
    """The context rows [rows, hidden] of the attention on the QKV rows qkv [rows, 3 hidden] of a
    hidden state of shape `shape` (padded [batch, seq, hidden] with mask, or packed with cu_seqlens);
    rope: (cos, sin) or None. On Triton written over the queries: the context is qkv's first third."""
    h = shape[-1]
    d = h // heads
    rope = rope or (None, None)
    if backend == "triton" and rel is None and not torch.compiler.is_compiling():
        # the same launches, their arguments bound once per specialization (not per size)
        return fb_backend.impl(backend, "attention").qkv_attention_forward(
            qkv, heads, mask, cu_seqlens, max_seqlen if cu_seqlens is not None else shape[1], 1.0 / math.sqrt(d),
            *rope, window)[0]
    if cu_seqlens is not None:
        q, k, v = qkv.view(-1, 3, heads, d).unbind(1)  # [tokens, heads, d] each
        keys, cu_seqlens = None, cu_seqlens.contiguous()
    else:
        q, k, v = qkv.view(*shape[:2], 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # [batch, heads, seq, d]
        keys = None if mask is None else mask.contiguous()
    if backend == "triton":
        inference_forward(q, k, v, keys, cu_seqlens, max_seqlen, 1.0 / math.sqrt(d), 0.0, None, False, rope, window,
                          rel, out=q)
        return qkv.narrow(1, 0, h)
    if cu_seqlens is not None:
        return varlen_attention_fwd(q, k, v, cu_seqlens, max_seqlen, 1.0 / math.sqrt(d), 0.0, None, False, *rope, window,
                                    rel, backend)[0].view(-1, h)
    return attention_fwd(q, k, v, keys, 1.0 / math.sqrt(d), 0.0, None, False, *rope, window, rel,
                         backend)[0].transpose(1, 2).reshape(-1, h)


def _add_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, backend: str) -> Tensor:
    """layer_norm(x + residual) for the routes here, x a GEMM's fresh output (on Triton written over)."""
    weight, bias = weight.contiguous(), None if bias is None else bias.contiguous()
    if backend == "triton":
        return fb_backend.impl(backend, "layer_norm").add_layer_norm_inference(x, residual, weight, bias, float(eps))
    return add_layer_norm_fwd(x, residual, weight, bias, float(eps), 0.0, None, backend)[0]


def _add_norm_sum(x: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, backend: str,
                  residual_dies: bool) -> Tuple[Tensor, Tensor]:
    """(layer_norm(s), s), s = x + residual, for the pre-LN route, x a GEMM's output or the previous
    layer's; on Triton the norm written over x and, where residual_dies, s over the residual."""
    weight, bias = weight.contiguous(), None if bias is None else bias.contiguous()
    if backend == "triton":
        return fb_backend.impl(backend, "layer_norm").add_layer_norm_inference(
            x, residual, weight, bias, float(eps), return_sum=True, sum_out=residual if residual_dies else None)
    y, _, _, s = add_layer_norm_sum_fwd(x, residual, weight, bias, float(eps), 0.0, None, backend)
    return y, s


def prenorm_layer_forward(hidden: Tensor, delta: Optional[Tensor], weights: PreNormLayerWeights, heads: int,
                          eps: Tuple[float, float], approximate: str, rotary_base: float, window: int,
                          mask: Optional[Tensor], cu_seqlens: Optional[Tensor], max_seqlen: Optional[int],
                          backend: Optional[str]) -> Optional[Tuple[Tensor, Tensor]]:
    """One pre-LN layer (ModernBERT's) for inference, the kernels of the separate ops called
    straight: the residual stream enters as hidden + delta (delta: the previous layer's feed-forward
    output, None before the first layer, whose attention norm is then none) and leaves as (hidden',
    delta'), as ModernBertEncoderLayer.forward gives them, bit for bit. Rows: padded [batch, seq,
    width] (mask: bool [batch, seq] or None) or packed [tokens, width] (cu_seqlens, max_seqlen);
    rotary_base: the layer's rotary embedding; window: local attention's reach (-1: every key); the
    feed-forward block a GeGLU (approximate: its GELU form). On Triton every kernel writes over an
    input that dies here (the stream too, but the first layer's: the embeddings' output) and keeps
    nothing only a backward reads. None where this route does not run (the torch backend, autocast,
    an empty input): the caller runs the separate ops."""
    backend = fb_backend.resolve(backend, hidden)
    if (not _prenorm_route(hidden, backend)) or (delta is None) != (weights.attn_norm_weight is None):
        return None
    stream, out = _prenorm_kernels(as_rows(hidden), None if delta is None else delta.reshape(-1, hidden.shape[-1]),
                                   hidden.shape, weights, heads, eps, approximate, rotary_base, window, mask,
                                   cu_seqlens, max_seqlen, backend)
    return stream.view(hidden.shape), out.view(hidden.shape)


def prenorm_layers_forward(hidden: Tensor, layers: Sequence[tuple], mask: Optional[Tensor],
                           cu_seqlens: Optional[Tensor], max_seqlen: Optional[int],
                           backend: Optional[str]) -> Optional[Tuple[Tensor, Tensor]]:
    """prenorm_layer_forward of each of `layers` ((weights, heads, eps, GeGLU form, rotary base,
    window) each, a model's kept reads of its layers, one backend setting for all) in turn, the
    stream entering as hidden alone -> (hidden', delta') after the last, the route decided once
    for the stack; None where it does not run them (as prenorm_layer_forward's None; also where
    the first layer has an attention norm or a later one has none): nothing has run then."""
    backend = fb_backend.resolve(backend, hidden)
    if not _prenorm_route(hidden, backend) or any((i == 0) != (w.attn_norm_weight is None)
                                                  for i, (w, *_) in enumerate(layers)):
        return None
    shape, x = hidden.shape, as_rows(hidden)  # the layers on rows, viewed back once

    def run_python() -> List[Tensor]:
        stream, delta = x, None
        for w, heads, eps, approximate, rotary_base, window in layers:
            stream, delta = _prenorm_kernels(stream, delta, shape, w, heads, eps, approximate, rotary_base, window,
                                             mask, cu_seqlens, max_seqlen, backend)
        return [stream, delta]

    launched = None
    if backend == "triton":
        launched = cuda_stack.prenorm_stack(x, shape, layers, mask, cu_seqlens, max_seqlen, run_python)
    stream, delta = run_python() if launched is None else launched
    return stream.view(shape), delta.view(shape)


def _prenorm_route(hidden: Tensor, backend: str) -> bool:
    # the kernels one by one (not the separate ops): not the torch backend, no autocast, an input
    return backend != "torch" and not torch.is_autocast_enabled(hidden.device.type) and hidden.numel() > 0


def _prenorm_kernels(stream, delta, shape, w: PreNormLayerWeights, heads, eps, approximate, rotary_base, window, mask,
                     cu_seqlens, max_seqlen, backend) -> Tuple[Tensor, Tensor]:
    """prenorm_layer_forward after its checks: the layer's kernels, called straight on the rows
    (stream contiguous [rows, width], delta [rows, width] or None) of a hidden state of shape
    `shape` -> (stream', delta') as rows."""
    width = shape[-1]
    if delta is None:
        normed = stream
    else:
        normed, stream = _add_norm_sum(delta, stream, w.attn_norm_weight, w.attn_norm_bias, eps[0], backend,
                                       residual_dies=True)
    positions = max_seqlen if cu_seqlens is not None else shape[1]
    rope = rotary_for(float(rotary_base), width // heads, positions, stream.device)
    qkv = rows_forward(normed, w.qkv_weight, w.qkv_bias, backend)
    ctx = _attention(qkv, shape, heads, mask, cu_seqlens, max_seqlen, rope, window, None, backend)
    normed, stream = _add_norm_sum(rows_forward(ctx, w.out_weight, w.out_bias, backend), stream, w.mlp_norm_weight,
                                   w.mlp_norm_bias, eps[1], backend, residual_dies=delta is not None)
    gated = rows_forward(normed, w.ffn_in_weight, w.ffn_in_bias, backend)
    if backend == "triton":
        gated = fb_backend.impl(backend, "geglu").geglu_inference(gated, approximate)
    else:
        gated = geglu_fwd(gated, approximate, backend)
    return stream, rows_forward(gated, w.ffn_out_weight, w.ffn_out_bias, backend)


def separate_ops(hidden, w: LayerWeights, heads, eps, approximate, mask, cu_seqlens, max_seqlen, rel, backend):
    """The same layer through the public ops (the torch backend's path, and autocast's)."""
    h = hidden.shape[-1]
    d = h // heads
    qkv = linear(hidden, w.qkv_weight, w.qkv_bias, backend=backend)
    if cu_seqlens is not None:
        q, k, v = qkv.view(-1, 3, heads, d).unbind(1)
        # cu_seqlens checked by encoder_layer, or the model's own
        ctx = varlen_attention(q, k, v, cu_seqlens, max_seqlen, backend=backend, relative_bias=rel,
                               validate=False).reshape(hidden.shape)
    else:
        bsz, seq = hidden.shape[:2]
        q, k, v = qkv.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = attention(q, k, v, mask, backend=backend, relative_bias=rel).transpose(1, 2).reshape(hidden.shape)
    h1 = add_layer_norm(linear(ctx, w.out_weight, w.out_bias, backend=backend), hidden, w.norm1_weight, w.norm1_bias,
                        eps[0], backend=backend)
    inter = bias_gelu(linear(h1, w.ffn_in_weight, backend=backend), w.ffn_in_bias, approximate, backend=backend)
    return add_layer_norm(linear(inter, w.ffn_out_weight, w.ffn_out_bias, backend=backend), h1, w.norm2_weight,
                          w.norm2_bias, eps[1], backend=backend)


def stack_paths(products: Sequence[Tuple[Tensor, ...]], rows: int, dtype: torch.dtype,
                ids: dict) -> Optional[List[int]]:
    """The 4 GEMM paths of each layer whose product weights (QKV, attention output, FFN in and out)
    `products` lists, in `ids` (fastbert.ops.gemm.layer_paths once per distinct set of weight
    shapes), or None while one is not measured yet or is not one the extension runs."""
    known, out = {}, []
    for weights in products:
        shapes = tuple(w.shape for w in weights)
        paths = known.get(shapes)
        if paths is None:
            paths = known[shapes] = gemm.layer_paths(rows, weights, dtype, ids)
            if paths is None:
                return None
        out.extend(paths)
    return out


def stack_applies(hidden: Tensor, int8: bool, mask: Optional[Tensor] = None, backend: Optional[str] = None) -> bool:
    """Whether a model's stack of layers may run in one call of the extension (encoder_stack,
    int8_encoder_stack) on this input, as far as it shows before the layers are read: the
    extension built, CPU tensors (float32 ones for the float stack, a bool mask), not while
    torch.compile traces, and `backend` (a layer's setting; every layer's must) the C++ one."""
    return (fb_backend.cpp_function("int8_encoder_forward" if int8 else "encoder_forward") is not None
            and hidden.device.type == "cpu" and hidden.numel() > 0 and not torch.compiler.is_compiling()
            and (int8 or (hidden.dtype == torch.float32 and (mask is None or mask.dtype == torch.bool)))
            and fb_backend.resolve(backend, hidden) == "cpp")


def _runs_stack(hidden: Tensor, int8: bool, mask: Optional[Tensor], layers: Sequence, backends) -> bool:
    return (len(layers) > 0 and stack_applies(hidden, int8, mask)
            and all(fb_backend.resolve(b, hidden) == "cpp" for b in backends))


def encoder_stack(hidden: Tensor, layers: Sequence[List[Tensor]], products: Sequence[Tuple[Tensor, ...]],
                  heads: Sequence[int], eps: Sequence[float], forms: Sequence[str], backends, *,
                  mask: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None, max_seqlen: int = 0,
                  rel: Optional[Tensor] = None, keep_states: bool = False) -> Optional[List[Tensor]]:
    """A model's float32 layers in one call of the extension, each as layer_forward's one call would
    run it: hidden [batch, seq, h] with mask (bool [batch, seq]) or None, or packed rows [tokens, h]
    with cu_seqlens and max_seqlen. layers[i]: layer i's LayerWeights then the parts of its joined
    QKV weight and bias (checked to be their slices still); products[i]: its 4 product weights;
    heads, forms: one a layer; eps: two a layer; backends: the layers' backend settings.
    -> [the last output] (keep_states: every layer's); [] where a joined tensor's parts are not its
    slices any more (join them again and call once more); None where this call does not run them
    here (not float32 on the C++ kernels, a GEMM path not measured or not one it runs)."""
    if not _runs_stack(hidden, False, mask, layers, backends):
        return None
    paths = stack_paths(products, hidden.numel() // hidden.shape[-1], torch.float32, FLOAT_LAYER_PATHS)
    if paths is None:
        return None
    return fb_backend.cpp_function("encoder_forward")(hidden, list(layers), paths, list(heads), list(eps), list(forms),
                                                      mask, cu_seqlens, max_seqlen, rel, keep_states)


def int8_encoder_stack(hidden: Tensor, hq: Tuple[Tensor, Tensor, Tensor], layers: Sequence[List[Tensor]],
                       products: Sequence[Tuple[Tensor, ...]], heads: Sequence[int], eps: Sequence[float],
                       forms: Sequence[str], backends, cu_seqlens: Tensor, max_seqlen: int,
                       rel: Optional[Tensor] = None, keep_states: bool = False) -> Optional[List[Tensor]]:
    """A model's int8 layers in one call of the extension, on packed rows hidden [tokens, h] and
    hq, their quantized rows: each layer what int8_linear (QKV), the varlen attention and int8_layer_rest
    give. layers[i]: layer i's Int8LayerWeights then the parts of its joined QKV weight, scale and
    bias; the rest and the results as encoder_stack's."""
    if not _runs_stack(hidden, True, None, layers, backends):
        return None
    paths = stack_paths(products, hq[0].shape[0], torch.int8, INT8_LAYER_PATHS)
    if paths is None:
        return None
    return fb_backend.cpp_function("int8_encoder_forward")(hidden, *hq, list(layers), paths, list(heads), list(eps),
                                                           list(forms), cu_seqlens.contiguous(), int(max_seqlen), rel,
                                                           keep_states)


def int8_layer_rest(ctx: Tensor, hidden: Tensor, w: Int8LayerWeights, eps: Tuple[float, float],
                    activation: Union[str, Callable[[Tensor], Tensor]], quantize_out: bool, gated: bool = False):
    """An int8 layer after its attention: ctx [rows, h] the attention's context, hidden [rows, h]
    the layer's input; activation: a GELU form ("none", "tanh"; fused with the bias and the
    quantization) or a function of float rows. gated: a gated feed-forward (w's FFN input the joined
    gate and up products), activation then a gate form of int8_glu ("none", "tanh", "silu": fused
    likewise) or a function of float rows giving act(a) * b of [a, b]. -> (the layer's output [rows,
    h], its quantized rows (q, scale, offset), or None unless quantize_out)."""
    h1, xq, _ = int8_add_norm(quantize_rows(ctx), w.out_weight, w.out_scale, w.out_bias, hidden, w.norm1_weight,
                              w.norm1_bias, eps[0], True, False)
    if isinstance(activation, str) and gated:
        xq = int8_glu_rows(xq, w.ffn_in_weight, w.ffn_in_scale, w.ffn_in_bias, activation)
    elif isinstance(activation, str):
        q, s, o = xq
        check_approximate("int8_bias_gelu", activation)
        fused = packed_epilogue("bias_gelu", q, w.ffn_in_weight)
        xq = (fused(q, w.ffn_in_weight, s, o, w.ffn_in_scale, w.ffn_in_bias, activation) if fused is not None else
              int8_bias_gelu(int8_matmul(q, w.ffn_in_weight), s, o, w.ffn_in_scale, w.ffn_in_bias, activation))
    else:
        xq = quantize_rows(activation(int8_linear(xq, w.ffn_in_weight, w.ffn_in_scale, w.ffn_in_bias, hidden.dtype)))
    h2, xq, _ = int8_add_norm(xq, w.ffn_out_weight, w.ffn_out_scale, w.ffn_out_bias, h1, w.norm2_weight,
                              w.norm2_bias, eps[1], quantize_out, False)
    return h2, xq


def int8_glu_rows(xq: Tuple[Tensor, Tensor, Tensor], weight: Tensor, scale: Tensor, bias: Optional[Tensor],
                  gate: str) -> Tuple[Tensor, Tensor, Tensor]:
    """A gated feed-forward's input products on int8 (weight: the gate and up products joined), then
    act(gate) * up quantized for the output product (int8_glu; gate: "none", "tanh" or "silu"): the
    quantized rows (q, scale, offset), with no float activation in memory."""
    q, s, o = xq
    fused = packed_epilogue("glu", q, weight)
    if fused is not None:
        return fused(q, weight, s, o, scale, bias, gate)
    return int8_glu(int8_matmul(q, weight), s, o, scale, bias, gate)


def int8_linear(xq: Tuple[Tensor, Tensor, Tensor], weight: Tensor, scale: Tensor, bias: Optional[Tensor],
                dtype: torch.dtype) -> Tensor:
    """An int8 linear layer (weight int8, per-channel scale, float bias or None) of the quantized
    rows xq = (q, scale, offset), as float rows of `dtype`."""
    q, s, o = xq
    fused = packed_epilogue("dequantize", q, weight)
    if fused is not None:
        return fused(q, weight, s, o, scale, bias, dtype)
    return int8_dequantize(int8_matmul(q, weight), s, o, scale, bias, dtype)


def int8_add_norm(xq: Tuple[Tensor, Tensor, Tensor], weight: Tensor, scale: Tensor, bias: Optional[Tensor],
                  stream: Tensor, norm_weight: Tensor, norm_bias: Optional[Tensor], eps: float, quantize: bool,
                  want_sum: bool):
    """A pre-LN layer's tail on int8 (ModernBERT's): a = the int8 linear layer of xq -> (norm(stream +
    a), its quantized rows (when `quantize`, else None), stream + a (when want_sum, else None): the
    residual stream, from the same pass over the accumulator). Biases None: zeros."""
    q, s, o = xq
    width = stream.shape[-1]
    bias = torch.zeros(width, dtype=stream.dtype, device=stream.device) if bias is None else bias
    if norm_bias is None:
        norm_bias = torch.zeros(width, dtype=norm_weight.dtype, device=norm_weight.device)
    fused = packed_epilogue("add_layer_norm_sum" if want_sum else "add_layer_norm", q, weight)
    if fused is not None:
        y, *rest = fused(q, weight, s, o, scale, bias, stream.contiguous(), norm_weight, norm_bias, float(eps),
                         bool(quantize))
    else:
        y, *rest = int8_add_layer_norm(int8_matmul(q, weight), s, o, scale, bias, stream, norm_weight, norm_bias, eps,
                                       quantize=quantize, return_sum=want_sum)
    total = rest.pop() if want_sum else None
    return y, (tuple(rest) if quantize else None), total


# --------------------------------------------------------------------------------------------
# CUDA graphs: the encoder captured once per bucket, replayed once per forward
#
# On CUDA a layer sends its GEMMs and kernels from Python, and below some 30k tokens a batch waits
# on the host that sends them (benchmarks/RESULTS.md, "The CUDA path's host cost"). Captured in a
# CUDA graph, the encoder (the embeddings through the last layer, on the packed real tokens) is one
# replay. A graph fixes every shape, so a batch runs in the graph of its bucket: its tokens padded
# to a token bucket (the extra rows belong to no sequence: the attention never reads them, the
# row-wise kernels compute them and nothing reads the result), its cu_seqlens to a batch bucket (the
# extra sequences empty), its longest sequence to a length bucket (the attention's grid). The
# kernels are those of the eager forward on the same shapes, so a replay gives its bits. Rows in no
# sequence are the Triton attention's to leave alone (the C++ one checks that cu_seqlens covers
# every row): the graphs run on the Triton backend.

TOKEN_BUCKET, BATCH_BUCKET, LENGTH_BUCKET = 64, 1, 16  # the smallest bucket of each
MAX_GRAPHS = 16  # graphs kept per model; the least recently used goes first


def bucket(n: int, smallest: int) -> int:
    """The bucket of n: the least of smallest * 2^k and 3/2 * smallest * 2^k (k >= 0) at or above
    n, so that padding adds at most half again (and a few buckets serve every size)."""
    b = smallest
    while True:
        if n <= b:
            return b
        if n <= b * 3 // 2:
            return b * 3 // 2
        b *= 2


class PackedInputs(NamedTuple):
    """A padded batch's real tokens, packed in ops.unpad's order: ids, token types and positions
    [tokens] (int64), cu_seqlens int32 [batch + 1], the longest sequence's length, and each real
    token's flat index in the padded batch (for ops.pad), with the padded shape (batch, seq)."""

    ids: Tensor
    types: Optional[Tensor]  # None: the model reads none (zeros in the graph's buffer)
    positions: Optional[Tensor]
    cu_seqlens: Tensor
    longest: int
    indices: Tensor
    shape: Tuple[int, int]

    @property
    def key(self) -> Tuple[int, int, int]:
        """The graph this batch runs in: its (tokens, batch, length) buckets."""
        return (bucket(self.ids.numel(), TOKEN_BUCKET), bucket(self.cu_seqlens.numel() - 1, BATCH_BUCKET),
                bucket(max(self.longest, 1), LENGTH_BUCKET))


def pack_inputs(input_ids: Tensor, token_type_ids: Optional[Tensor], position_ids: Optional[Tensor],
                attention_mask: Optional[Tensor]) -> PackedInputs:
    """The real tokens of input_ids, token_type_ids and position_ids ([batch, seq] each, or None
    where the model reads none; positions may be expanded) under attention_mask ([batch, seq],
    None: every token), packed. Reading the mask's lengths is the one host synchronisation of a
    replayed forward."""
    bsz, seq = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones((bsz, seq), dtype=torch.bool, device=input_ids.device)
    indices, cu_seqlens, longest = unpad_indices(attention_mask)

    def take(t: Optional[Tensor]) -> Optional[Tensor]:
        return None if t is None else t.expand(bsz, seq).reshape(-1).index_select(0, indices)

    return PackedInputs(take(input_ids), take(token_type_ids), take(position_ids), cu_seqlens, longest, indices,
                        (bsz, seq))


# encode(ids, types, positions, cu_seqlens, max_seqlen) -> the last layer's rows [tokens, hidden]
PackedEncoder = Callable[[Tensor, Tensor, Tensor, Tensor, int], Tensor]


class _Bucket:
    """One bucket's static inputs and its output; `capture`: a CUDA graph of `encode` on them
    (else `encode` runs on them at each call: the same steps without the graph, which the CPU
    tests run)."""

    def __init__(self, key: Tuple[int, int, int], encode: PackedEncoder, device, capture: bool, pool) -> None:
        tokens, batch, self.longest = key
        self.ids = torch.zeros(tokens, dtype=torch.long, device=device)
        self.types = torch.zeros_like(self.ids)
        self.positions = torch.zeros_like(self.ids)
        self.cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.encode = encode
        self.graph = None
        if capture:
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):  # kernels compiled, workspaces and sinks sized, outside the graph
                for _ in range(2):
                    self._run()
            torch.cuda.current_stream(device).wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.out = self._run()

    def _run(self) -> Tensor:
        return self.encode(self.ids, self.types, self.positions, self.cu_seqlens, self.longest)

    def __call__(self, packed: PackedInputs) -> Tensor:
        """The encoder's rows for packed's tokens [tokens, hidden], valid until the next call."""
        n, b = packed.ids.numel(), packed.cu_seqlens.numel() - 1
        self.ids[:n].copy_(packed.ids)  # rows past n keep earlier ids, types, positions: valid, unread
        for static, given in ((self.types, packed.types), (self.positions, packed.positions)):
            if given is not None:
                static[:n].copy_(given)
        self.cu_seqlens[:b + 1].copy_(packed.cu_seqlens)
        self.cu_seqlens[b + 1:].fill_(n)  # the bucket's extra sequences: empty
        if self.graph is None:
            return self._run()[:n]
        self.graph.replay()
        return self.out[:n]


class EncoderGraphs:
    """A model's encoder as CUDA graphs, one per bucket of (tokens, batch, longest sequence),
    captured at a bucket's first batch and replayed at every later one; at most `max_graphs`, the
    least recently used dropped first. Every graph allocates from one memory pool, which holds about
    one forward's activations of the largest bucket in use (replays run one at a time, so their
    temporaries can share it). `capture` False: the same buckets and static buffers, run eagerly
    (what the CPU tests check)."""

    def __init__(self, encode: PackedEncoder, max_graphs: int = MAX_GRAPHS, capture: bool = True) -> None:
        if max_graphs < 1:
            raise ValueError(f"fastbert: max_graphs must be at least 1, got {max_graphs}")
        self.encode, self.max_graphs, self.capture = encode, max_graphs, capture
        self.buckets: "collections.OrderedDict[Tuple[int, int, int], _Bucket]" = collections.OrderedDict()
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.lock = threading.Lock()  # one replay at a time: their static buffers and pool are shared
        self.sources: Optional[tuple] = None

    def __len__(self) -> int:
        return len(self.buckets)

    def __deepcopy__(self, memo) -> None:
        return None  # a copied model captures its own graphs (at its first forward that runs them)

    def __reduce__(self):
        return type(None), ()  # pickled as None: graphs live on one GPU in one process

    def __call__(self, packed: PackedInputs, sources: Callable[[], tuple]) -> Tensor:
        """The encoder's last hidden state [batch, seq, hidden] (zeros at padding) for packed.
        sources() gives what the graphs read and must not outlive (the parameters' storages): when
        it changes, every graph is dropped and captured again."""
        # normal tensors whatever mode the caller is in: buffers made under torch.inference_mode
        # could not be written outside it (a later forward under no_grad alone), nor saved for later
        with self.lock, torch.inference_mode(False), torch.no_grad():
            if sources() != self.sources:
                self.buckets.clear()
            key = packed.key
            run = self.buckets.get(key)
            made = run is None
            if made:
                while len(self.buckets) >= self.max_graphs:
                    self.buckets.popitem(last=False)
                run = self.buckets[key] = _Bucket(key, self.encode, packed.ids.device, self.capture, self.pool)
            self.buckets.move_to_end(key)
            rows = run(packed)
            if made:  # read after the first run, which may have joined the QKV weights anew
                self.sources = sources()
            return pad(rows, packed.indices, *packed.shape)
