"""int8 inference in plain PyTorch: the exact rules of fastbert's int8 kernels (csrc/int8.cpp),
and the "torch" backend of fastbert.ops.int8.

Weights are quantized per output channel, symmetrically; activations per row (token),
asymmetrically about the row's midpoint:

    weight row w:      s = max|w| / Q,  q = round(w * (Q / max|w|))               w ~ q * s
    activation row x:  o = (max x + min x) / 2,  r = (max x - min x) / 2,
                       s = r / 127,  q = round((x - o) * (127 / r))              x ~ q * s + o

(round half to even, in fp32; a constant row has s = 0, q = 0 and o its value). Q, the weight's
range, is a setting of the quantized model (quantize_("int8", weight_range=...)): 127 unless asked
otherwise, on every CPU, since every kernel level multiplies such weights exactly and at its full
speed; 64 is kept for models quantized so before (accuracy in benchmarks/RESULTS.md). The
activation's midpoint matters: a LayerNorm's output rows are far from centred on 0
(its bias has a few large entries), and spending the 8 bits on [min, max] instead of [-max|x|,
max|x|] roughly halves the error on MiniLM's sentence embeddings (benchmarks/RESULTS.md). Quantized
activations carry one extra row of ones, so that the int8 GEMM

    acc = q_x @ q_w^T                 exact, in int32; its last row: the column sums of q_w

also gives the sums that the offsets multiply, and the layer's output x w^T + b is

    y = (acc[:-1] * s_x[:, None] + o_x[:, None] * acc[-1]) * s_w + b

its "epilogue", applied by the op that reads y. Nothing derived from the weight is ever stored.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from fastbert.layouts import unpack_weight

Tensor = torch.Tensor


def quantize_rows(x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """x [rows, n] float -> (q int8 [rows + 1, n] (last row ones), scale float32 [rows], offset float32 [rows])."""
    v = x.float()
    mx, mn = v.amax(dim=-1), v.amin(dim=-1)
    offset, half = (mx + mn) * 0.5, (mx - mn) * 0.5
    # a tensor divided by a tensor: IEEE division, as the kernels do it (a Python number divided by
    # a tensor is a multiplication by its reciprocal in torch, which can round differently)
    inv = torch.where(half > 0, torch.full_like(half, 127.0) / half, torch.zeros_like(half))
    q = torch.round((v - offset[:, None]) * inv[:, None]).clamp_(-128, 127).to(torch.int8)
    q = torch.cat([q, torch.ones_like(q[:1])])
    return q, half / 127.0, offset


def int8_mm(a: Tensor, b: Tensor) -> Tensor:
    """a [m, k] int8 @ b [n, k]^T int8 -> int32 [m, n], exact (b may be packed: fastbert.layouts.pack_weight)."""
    if b.dim() == 4:
        b = unpack_weight(b, a.shape[1])
    if a.device.type == "cpu" and a.shape[1] > 1:  # torch._int_mm (2.13, CPU) is wrong for k = 1
        return torch._int_mm(a, b.t())
    return (a.double() @ b.double().t()).to(torch.int32)  # exact below 2^53


def dequantize(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor,
               bias: Optional[Tensor]) -> Tensor:
    """The layer output of acc [rows + 1, n] (int32 or float32), float32 [rows, n]."""
    a = acc.float()
    y = (a[:-1] * row_scale[:, None] + row_offset[:, None] * a[-1]) * col_scale.float()
    return y if bias is None else y + bias.float()


def int8_dequantize(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Optional[Tensor],
                    dtype: torch.dtype) -> Tensor:
    return dequantize(acc, row_scale, row_offset, col_scale, bias).to(dtype)


def int8_bias_gelu(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Tensor,
                   approximate: str = "none") -> Tuple[Tensor, Tensor, Tensor]:
    """quantize_rows(gelu(dequantize(acc, ...)))."""
    return quantize_rows(F.gelu(dequantize(acc, row_scale, row_offset, col_scale, bias), approximate=approximate))


def int8_glu(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Optional[Tensor],
             gate: str = "none") -> Tuple[Tensor, Tensor, Tensor]:
    """quantize_rows(act(a) * b), [a, b] = dequantize(acc, ...) (fp32) split in halves; act: GELU
    ("none", "tanh") or SiLU ("silu")."""
    a, b = dequantize(acc, row_scale, row_offset, col_scale, bias).chunk(2, dim=-1)
    return quantize_rows((F.silu(a) if gate == "silu" else F.gelu(a, approximate=gate)) * b)


def int8_add_layer_norm(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Tensor,
                        residual: Tensor, weight: Tensor, ln_bias: Tensor, eps: float,
                        quantize: bool, return_sum: bool = False) -> Tuple[Tensor, ...]:
    """(y, q, scale, offset): y = layer_norm(h) in residual's dtype, h = dequantize(acc, ...) + residual
    (fp32); (q, scale, offset) = quantize_rows of y (in fp32, before the cast) when `quantize`, else
    empty; return_sum: h in residual's dtype too, fifth."""
    h = dequantize(acc, row_scale, row_offset, col_scale, bias) + residual.float()
    y = F.layer_norm(h, h.shape[-1:], weight.float(), ln_bias.float(), eps)
    if quantize:
        q, s, o = quantize_rows(y)
    else:
        q, s, o = acc.new_empty(0, dtype=torch.int8), acc.new_empty(0, dtype=torch.float32), acc.new_empty(
            0, dtype=torch.float32)
    out = (y.to(residual.dtype), q, s, o)
    return (*out, h.to(residual.dtype)) if return_sum else out
