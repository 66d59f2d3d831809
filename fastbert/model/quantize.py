"""int8 inference for fastbert's BERT: `quantize_("int8")` / `from_pretrained(..., quantize="int8")`.

Every linear layer of the encoder (the QKV projections, the attention output, both FFN layers)
becomes an Int8Linear: its weight is quantized once, per output channel, to [-weight_range,
weight_range] (a setting of the quantized model: 127 unless asked otherwise, the same on every CPU;
the model's `quantization` says it, save_pretrained records it in config.json and from_pretrained
quantizes a directory so recorded again the same way), and the int8 weight and its scales are then
the layer's only copy of it (the weight stored packed,
in the layout fastbert's packed int8 GEMM reads, where fastbert.ops.int8.int8_layout measured that
faster here: then no call repacks it). Nothing is derived from a
float weight that could fall behind it: a write into the int8 weight (through .data, copy_) is what
the next forward multiplies by; load_state_dict quantizes the float weights it is given into the
same tensors; state_dict() gives transformers' names and the dequantized float weights, so
save_pretrained writes a checkpoint transformers loads. The QKV projections are slices of one [3 hidden, hidden]
int8 tensor (packed: [3 hidden / 16, ...]) (re-joined whenever to() or an assignment gave them memory of their own), so one GEMM
serves all three.

Activations are quantized per token, about each token's midpoint (fastbert.reference.int8 has the
rule and why), inside the fused ops that produce them (fastbert.ops.int8: the LayerNorm tails and
bias + GELU emit int8 rows; the attention's output is quantized in a pass of its own, since one
token's row spans every head and the attention kernel works a (sequence, head) pair at a time); the
QKV product is dequantized in a pass of its own before the attention. LayerNorm, softmax, GELU and
the residual stream stay in the model's float dtype (fp32 or bf16). The embeddings, the pooler and
the task heads stay float.

A quantized model runs inference only: forward in training mode, or a backward through it, is an
error that names the fix (load without quantize=).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fastbert import ops
from fastbert.layouts import WEIGHT_RANGES

QUANTIZE_MODES = ("int8",)
DEFAULT_WEIGHT_RANGE = WEIGHT_RANGES[0]
# the config.json key of a quantized model's settings ({"mode": "int8", "weight_range": 127}); not
# transformers' quantization_config, which transformers would try to load with a quantizer of its own
CONFIG_KEY = "fastbert_quantization"
TRAINING_ERROR = ("fastbert: this model is quantized to int8 for inference; training and gradients need the "
                  "float weights: load it without quantize= (or before quantize_)")


def check_quantize(mode, where: str) -> Optional[str]:
    """`mode` checked: None or "int8"."""
    if mode is not None and mode not in QUANTIZE_MODES:
        raise ValueError(f"{where}: quantize={mode!r} is not supported; choose 'int8' or None")
    return mode


class Int8Linear(nn.Module):
    """nn.Linear with an int8 weight (per output channel symmetric, in [-weight_range, weight_range];
    `weight_scale` [out], float32) and a float bias, for inference. Built from an nn.Linear, whose
    bias Parameter it keeps. weight_range: 127 or 64. The weight is [out, in], or packed [out / 16,
    ceil(in / 4), 16, 4] where fastbert.ops.int8.int8_layout() measured the packed GEMM faster (the
    two give the same products; `int8_weight()` gives [out, in] either way)."""

    def __init__(self, linear: nn.Linear, weight_range: int = DEFAULT_WEIGHT_RANGE):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_range = weight_range
        q, s = ops.quantize_weight(linear.weight, self.weight_range)
        q = ops.int8.stored_weight(q)  # packed where measured faster
        self.register_buffer("weight", q, persistent=False)        # state_dict: see _save_to_state_dict
        self.register_buffer("weight_scale", s, persistent=False)
        self.bias = linear.bias
        self.float_dtype = linear.weight.dtype  # the float weight's dtype (to() follows it): state_dict's, without a bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8 weights in [-{self.weight_range}, {self.weight_range}]{', packed' if self.weight.dim() == 4 else ''}")

    def int8_weight(self) -> torch.Tensor:
        """The int8 weight [out, in] (a copy when it is stored packed)."""
        return ops.unpack_int8_weight(self.weight, self.in_features) if self.weight.dim() == 4 else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """F.linear(x, weight, bias) on int8: x quantized per row, int32 GEMM, dequantized to x's dtype."""
        q, s, o = ops.quantize_rows(x.reshape(-1, self.in_features))
        y = ops.int8_dequantize(ops.int8_matmul(q, self.weight), s, o, self.weight_scale, self.bias, x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """weight * weight_scale [out, in], in the bias's dtype (without a bias: the float weight's,
        as to() / half() / float() last cast the layer)."""
        dtype = self.bias.dtype if self.bias is not None else self.float_dtype
        return (self.int8_weight().float() * self.weight_scale[:, None]).to(dtype)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.dequantized_weight()  # nn.Linear's order: weight, then bias
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weight"
        if key in state_dict:
            w = state_dict[key]
            if tuple(w.shape) != (self.out_features, self.in_features):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(w.shape)} from "
                                  f"checkpoint, the shape in current model is {(self.out_features, self.in_features)}.")
            else:
                q, s = ops.quantize_weight(w.to(self.weight.device), self.weight_range)
                if self.weight.dim() == 4:
                    q = ops.pack_int8_weight(q)
                with torch.no_grad():  # in place: the QKV slices stay slices of the joined tensor
                    self.weight.copy_(q)
                    self.weight_scale.copy_(s)
            state_dict = {k: v for k, v in state_dict.items() if k != key}
        elif strict:
            missing_keys.append(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _apply(self, fn, recurse=True):
        # .to(dtype) / .half() cast floating buffers; the scales stay float32 (moved, never rounded)
        scale = self.weight_scale
        super()._apply(fn, recurse)
        if self.weight_scale.dtype != scale.dtype:
            self.weight_scale = scale.to(self.weight_scale.device)
        self.float_dtype = fn(torch.empty(0, dtype=self.float_dtype)).dtype  # what fn does to a float weight
        return self


def settings(mode: str = "int8", weight_range: Optional[int] = None, where: str = "quantize_") -> dict:
    """A quantized model's settings, checked, with their defaults: {"mode", "weight_range"} (what
    CONFIG_KEY holds in config.json). Everything that changes an int8 model's results is here;
    timings choose only among paths that give the same results."""
    check_quantize(mode, where)
    if mode is None:
        raise ValueError(f"{where}: quantize=None has no settings; choose 'int8'")
    weight_range = DEFAULT_WEIGHT_RANGE if weight_range is None else weight_range
    if isinstance(weight_range, bool) or weight_range not in WEIGHT_RANGES:
        raise ValueError(f"{where}: weight_range must be one of {WEIGHT_RANGES} (default {DEFAULT_WEIGHT_RANGE}), "
                         f"got {weight_range!r}")
    return {"mode": mode, "weight_range": int(weight_range)}


def recorded(config, where: str) -> Optional[dict]:
    """The settings a config.json records (CONFIG_KEY), checked; None when it records none."""
    saved = getattr(config, CONFIG_KEY, None)
    if saved is None:
        return None
    if not isinstance(saved, dict) or set(saved) - {"mode", "weight_range"}:
        raise ValueError(f"{where}: config.json's {CONFIG_KEY} must be {{'mode': 'int8', 'weight_range': 127 or 64}}, "
                         f"got {saved!r}")
    return settings(saved.get("mode"), saved.get("weight_range"), f"{where} (config.json's {CONFIG_KEY})")


def quantize_model(model: nn.Module, mode: str = "int8", weight_range: Optional[int] = None) -> dict:
    """Turn every encoder linear layer of `model` (a fastbert class of the family: the linear_slots()
    of each of its encoder layers, BertLayer's or ModernBertEncoderLayer's) into an Int8Linear, in
    place, its weights in [-weight_range, weight_range] (None: DEFAULT_WEIGHT_RANGE). Returns the
    settings (settings())."""
    chosen = settings(mode, weight_range, f"{type(model).__name__}.quantize_")
    if not hasattr(torch, "_int_mm"):
        raise RuntimeError("fastbert: int8 inference needs torch._int_mm (torch >= 2.4)")
    for layer in model.modules():
        if not callable(getattr(layer, "linear_slots", None)):
            continue
        for owner, name in layer.linear_slots():
            linear = getattr(owner, name)
            if isinstance(linear, Int8Linear):
                if linear.weight_range != chosen["weight_range"]:
                    raise ValueError(f"{type(model).__name__}.quantize_: the model is quantized with weight_range="
                                     f"{linear.weight_range} already; load it again to quantize with "
                                     f"weight_range={chosen['weight_range']}")
            else:
                setattr(owner, name, Int8Linear(linear, chosen["weight_range"]))
    return chosen


class InferenceOnly(torch.autograd.Function):
    """run(hidden) with no backward: a gradient through the int8 encoder is an error naming the fix."""

    @staticmethod
    def forward(ctx, hidden, run):
        return run(hidden)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(TRAINING_ERROR)
