"""int8 inference for ModernBERT: `quantize_("int8")` / `from_pretrained(..., quantize="int8")`, as for
BERT (fastbert.model.int8: the weights, their never-stale guarantees and the activation scheme).

Each layer's four linear layers (Wqkv, one [3 hidden, hidden] projection; the attention's Wo; Wi,
[2 intermediate, hidden], feeding the GeGLU; the MLP's Wo) are Int8Linear, biases or not
(config.attention_bias, mlp_bias). The embeddings, final_norm and the task heads stay float. A layer
on the rows (packed real tokens, or the padded batch flattened), its input the residual stream h
and the int8 rows of attn_norm(h), made by the layer before:

    qkv   = int8_dequantize(int8_matmul(x_q, Wqkv_q), ...)            -> attention (rotary, window) -> ctx
    acc   = int8_matmul(quantize_rows(ctx), Wo_q)
    m_q, h = int8_add_layer_norm(acc, ..., residual=h, mlp_norm, return_sum=True)
                                          (mlp_norm(h + a) quantized, and h + a: the residual stream)
    g     = geglu(int8_dequantize(int8_matmul(m_q, Wi_q), ...))
    acc   = int8_matmul(quantize_rows(g), Wo_q)
    x_q, h = int8_add_layer_norm(acc, ..., residual=h, next attn_norm, return_sum=True)
                                          (final_norm after the last layer, whose output it is, unquantized)

Each int8_add_layer_norm gives the norm and the residual stream from one pass over the accumulator.
What a fused int8 GeGLU would save (none exists yet, so it is composed): the accumulator dequantized,
gelu(a) * b, quantized for the next GEMM, as int8_bias_gelu does for BERT, would spare the float
[rows, 2 intermediate] and [rows, intermediate] tensors it writes and reads.

Inference only: forward in training mode, or a backward through the encoder, is the error of
fastbert.model.int8 naming the fix.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fastbert import ops
from fastbert.model.config import OTHER_ACTIVATIONS
from fastbert.model.int8 import TRAINING_ERROR, InferenceOnly
from fastbert.ops.bias_gelu import GELU_FORMS


def _or_zeros(bias: Optional[torch.Tensor], n: int, like: torch.Tensor) -> torch.Tensor:
    """bias, or zeros [n] where the layer has none (int8_add_layer_norm takes a bias tensor)."""
    return torch.zeros(n, dtype=like.dtype, device=like.device) if bias is None else bias


def _linear(lin, xq, dtype: torch.dtype) -> torch.Tensor:
    """lin (an Int8Linear) of the quantized rows xq = (q, scale, offset), as float rows of `dtype`."""
    q, s, o = xq
    return ops.int8_dequantize(ops.int8_matmul(q, lin.weight), s, o, lin.weight_scale, lin.bias, dtype)


def _add_norm(lin, xq, stream: torch.Tensor, norm: nn.LayerNorm, quantize: bool, want_sum: bool):
    """a = lin(x) on the quantized rows xq; -> (norm(stream + a), its quantized rows (when
    `quantize`), stream + a (when want_sum, else None): the residual stream, from the same pass over
    the accumulator)."""
    q, s, o = xq
    acc = ops.int8_matmul(q, lin.weight)
    width = stream.shape[-1]
    y, *yq = ops.int8_add_layer_norm(acc, s, o, lin.weight_scale, _or_zeros(lin.bias, width, stream), stream,
                                     norm.weight, _or_zeros(norm.bias, width, norm.weight), norm.eps, quantize=quantize,
                                     return_sum=want_sum)
    total = yq.pop() if want_sum else None
    return y, (tuple(yq) if quantize else None), total


def _gated(mlp, hq, dtype: torch.dtype):
    """The MLP's act(input) * gate on Wi of the quantized rows hq, quantized for its Wo."""
    h = _linear(mlp.Wi, hq, dtype)
    if mlp.act in GELU_FORMS:
        h = ops.geglu(h, GELU_FORMS[mlp.act], backend=mlp.backend)
    else:
        inp, gate = h.chunk(2, dim=-1)
        h = OTHER_ACTIVATIONS[mlp.act](inp) * gate
    return ops.quantize_rows(h)


def int8_layer(layer, stream: torch.Tensor, xq, next_norm: nn.Module, attend, last: bool, want_sum: bool):
    """One ModernBertEncoderLayer on rows: stream [rows, hidden] and xq, the quantized rows of
    attn_norm(stream); attend(attention module, qkv rows) -> (context rows, probabilities or None).
    -> (next_norm(layer output) (final_norm's output after the last layer), its quantized rows (None
    after the last), the layer's output (None after the last unless want_sum), probabilities)."""
    attn, mlp = layer.attn, layer.mlp
    ctx, probs = attend(attn, _linear(attn.Wqkv, xq, stream.dtype))
    mq, stream = _add_norm(attn.Wo, ops.quantize_rows(ctx), stream, layer.mlp_norm, True, True)[1:]
    y, yq, total = _add_norm(mlp.Wo, _gated(mlp, mq, stream.dtype), stream, next_norm, not last,
                             want_sum or not last)
    return y, yq, total, probs


def encode_int8(model, hidden: torch.Tensor, mask: Optional[torch.Tensor], packed, to_output, want_states: bool,
                want_probs: bool):
    """ModernBertModel._encode on int8 (the same arguments and results): hidden [tokens, hidden]
    packed (packed = (cu_seqlens, max_seqlen)) or [batch, seq, hidden] padded (mask or None)."""
    if model.training:
        raise RuntimeError(TRAINING_ERROR)
    layers = list(model.layers)
    if not layers:
        return model._encode(hidden, mask, packed, to_output, want_states, want_probs)
    shape, width = hidden.shape, hidden.shape[-1]
    rows = hidden.reshape(-1, width)

    def attend(attn, qkv):
        ctx, p = attn.attend(qkv, shape, mask, packed, want_probs)
        return ctx.reshape(-1, width), p

    def run(h):
        outs, probs = [], []
        xq = ops.quantize_rows(h)  # layer 0's attn_norm is Identity (the embeddings end in a LayerNorm)
        for i, layer in enumerate(layers):
            last = i == len(layers) - 1
            norm = model.final_norm if last else layers[i + 1].attn_norm
            y, xq, h, p = int8_layer(layer, h, xq, norm, attend, last, want_states)
            if last or want_states:  # transformers gives the last layer's output after final_norm
                outs.append(to_output((y if last else h).view(shape)))
            probs.append(p)
        return (*outs, *(probs if want_probs else ()))

    out = InferenceOnly.apply(rows, run) if torch.is_grad_enabled() and rows.requires_grad else run(rows)
    n_out = len(layers) if want_states else 1
    probs = tuple(out[n_out:]) if want_probs else None
    return out[n_out - 1], ((to_output(hidden), *out[:n_out]) if want_states else None), probs
