"""Parameters joined into one tensor: the QKV projections' weights, biases (and int8 scales) made
consecutive slices of one tensor, so that one GEMM serves the three with no copy and nothing that
can fall behind them. share_storage joins; views_of checks that the parts are still the slices (a
write in place, by any optimizer or through copy_ or load_state_dict, keeps them so; new memory
through to(), `.data = ...` or an assignment does not), and `joined` joins again where they are not.
trainable hands the joined tensor to autograd as the parameters' concatenation, for training."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from fastbert.model.quantize import Int8Linear


def share_storage(params) -> torch.Tensor:
    """Move the parameters' values into one new tensor (their concatenation along dim 0) and make
    each parameter a view of its slice; returns the concatenation. The Parameter objects stay the
    same (optimizers keep them); only their .data is rebound."""
    fused = torch.cat([p.detach() for p in params])
    start = 0
    for p in params:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused


def views_of(fused: Optional[torch.Tensor], params) -> bool:
    """Whether every parameter is still the contiguous slice of `fused` that share_storage made it:
    then `fused` holds their current values, however they were written (in place by any optimizer,
    through .data, copy_, load_state_dict). A parameter given new memory (to(), .data = ..., assign)
    fails the check."""
    if fused is None:
        return False
    start = fused.data_ptr()
    row = fused.stride(0) * fused.element_size()
    device, dtype, tail = fused.device, fused.dtype, fused.shape[1:]  # read once: each read makes an object
    for p in params:
        shape = p.shape
        if (p.data_ptr() != start or shape[1:] != tail or p.dtype != dtype or p.device != device
                or not p.is_contiguous()):
            return False
        start += shape[0] * row
    return start == fused.data_ptr() + fused.shape[0] * row


class Unmoved:
    """Whether tensors are where they were: each one's address, sizes, strides, dtype and device
    as at construction, read for all of them in a few C-level passes (views_of reads each part in
    Python: a BERT model's QKV parts cost a forward 20 us a layer that way on a Zen 1, 8 this way).
    Made right after views_of found `parts` to be the slices of joined tensors that something keeps
    alive, it answers views_of's question for all of them: a part that still covers the same bytes
    the same way is still its slice (no other tensor can be given a live tensor's memory), and one
    given new memory (to(), `.data = ...`) or a new shape fails it."""

    __slots__ = ("_parts", "_seen")

    def __init__(self, parts) -> None:
        self._parts = list(parts)
        self._seen = _layout(self._parts)

    def __call__(self) -> bool:
        return _layout(self._parts) == self._seen


_DTYPE, _DEVICE = torch.Tensor.dtype.__get__, torch.Tensor.device.__get__


def _layout(parts: List[torch.Tensor]) -> tuple:
    T = torch.Tensor
    return (list(map(T.data_ptr, parts)), list(map(T.size, parts)), list(map(T.stride, parts)),
            list(map(_DTYPE, parts)), list(map(_DEVICE, parts)))


def joined(owner, name: str, parts: List[torch.Tensor]) -> torch.Tensor:
    """One tensor whose consecutive slices `parts` are (made so now when they are not)."""
    key = "_joined_" + name
    kept = owner.__dict__.get(key)
    if not views_of(kept, parts):
        with torch.no_grad():
            kept = share_storage(parts)
        owner.__dict__[key] = kept
    return kept


class _Joined(torch.autograd.Function):
    """(fused weight, fused bias) (not differentiable), then the weights and the biases they join
    (k of each) -> the two fused tensors themselves, whose gradients arrive split into theirs."""

    @staticmethod
    def forward(ctx, weight, bias, *params):
        k = len(params) // 2
        ctx.rows = [p.shape[0] for p in params[:k]]
        return weight.view_as(weight), bias.view_as(bias)

    @staticmethod
    def backward(ctx, dweight, dbias):
        return (None, None, *dweight.split(ctx.rows), *dbias.split(ctx.rows))


class _JoinedWeight(torch.autograd.Function):
    """_Joined for parts with no bias: the fused weight, then the weights it joins."""

    @staticmethod
    def forward(ctx, weight, *params):
        ctx.rows = [p.shape[0] for p in params]
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, dweight):
        return (None, *dweight.split(ctx.rows))


def trainable(weight: torch.Tensor, bias: Optional[torch.Tensor], weights, biases
              ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """`weight` and `bias` (share_storage's joins of weights and of biases, views_of true; bias None
    where the parts have none) as autograd takes them: the concatenations of the parts, with no copy
    forward (torch.cat would make one every step) and each part's gradient a slice of the joined
    one's; one autograd node for both."""
    if bias is None:
        return _JoinedWeight.apply(weight, *weights), None
    return _Joined.apply(weight, bias, *weights, *biases)


def joined_linear(owner, name: str, modules) -> tuple:
    """Linear layers that read the same input (a gated feed-forward's gate and up, a layer's Q, K and
    V) as one GEMM's tensors, their weights (and biases, where they have them) joined into one
    tensor kept on `owner` under `name`: no copy, nothing that can fall behind the parameters. Float
    (nn.Linear): (weight, bias or None), under autograd the parts' concatenation (trainable); while
    torch.compile traces, torch.cat of them. Once quantized (Int8Linear): (int8 weight, scale, bias
    or None)."""
    biases = None if modules[0].bias is None else [m.bias for m in modules]
    if isinstance(modules[0], Int8Linear):
        return (joined(owner, f"int8_{name}_weight", [m.weight for m in modules]),
                joined(owner, f"int8_{name}_scale", [m.weight_scale for m in modules]),
                None if biases is None else joined(owner, f"int8_{name}_bias", biases))
    weights = [m.weight for m in modules]
    if torch.compiler.is_compiling():
        return torch.cat(weights), None if biases is None else torch.cat(biases)
    w = joined(owner, f"{name}_weight", weights)
    b = None if biases is None else joined(owner, f"{name}_bias", biases)
    if torch.is_grad_enabled() and any(p.requires_grad for p in weights + (biases or [])):
        return trainable(w, b, weights, biases)
    return w, b
