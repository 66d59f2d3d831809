"""Parameters joined into one tensor: the QKV projections' weights, biases (and int8 scales) made
consecutive slices of one tensor, so that one GEMM serves the three with no copy and nothing that
can fall behind them. share_storage joins; views_of checks that the parts are still the slices (a
write in place, by any optimizer or through copy_ or load_state_dict, keeps them so; new memory
through to(), `.data = ...` or an assignment does not), and `joined` joins again where they are not.
trainable hands the joined tensor to autograd as the parameters' concatenation, for training."""
from __future__ import annotations

from typing import List, Optional

import torch


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
    """fused (not differentiable), then the parameters it joins -> fused itself, whose gradient
    arrives split into theirs."""

    @staticmethod
    def forward(ctx, fused, *params):
        ctx.rows = [p.shape[0] for p in params]
        return fused.view_as(fused)

    @staticmethod
    def backward(ctx, grad):
        return (None, *grad.split(ctx.rows))


def trainable(fused: torch.Tensor, params) -> torch.Tensor:
    """`fused` (share_storage's join of params, views_of true) as autograd takes it: the
    concatenation of params, with no copy forward (torch.cat would make one every step) and each
    parameter's gradient a slice of the joined one."""
    return _Joined.apply(fused, *params)
