"""Shared pieces of the functional ops: input checks with readable errors, backend lookup, seeds."""
from __future__ import annotations

from typing import Optional

import torch

from fastbert.reference import check_seed, new_seed

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fastbert.ops.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"fastbert.ops.{op}: {name} has dtype {t.dtype}; supported: float32, float16, bfloat16")


def check_vector(op: str, name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    """`t` is a per-feature parameter of x: shape [hidden], dtype x's or float32, x's device."""
    check_float(op, name, t)
    n = x.shape[-1]
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(
            f"fastbert.ops.{op}: {name} has shape {tuple(t.shape)} but x has hidden size {n} "
            f"(x.shape = {tuple(x.shape)}); {name} must have shape ({n},)"
        )
    if t.dtype not in (x.dtype, torch.float32):
        raise TypeError(
            f"fastbert.ops.{op}: {name} has dtype {t.dtype} but x has dtype {x.dtype}; "
            f"{name} must be {x.dtype} or float32"
        )
    check_device(op, name, t, x)


def check_device(op: str, name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.device != x.device:
        raise ValueError(f"fastbert.ops.{op}: {name} is on {t.device} but x is on {x.device}")


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """A contiguous [rows, hidden] view of t (a copy only when t is not contiguous)."""
    return t.contiguous().view(-1, t.shape[-1])




def fused_op(name: str, fake):
    """Register `fn` as the torch.library custom op fastbert::<name> (with `fake` for its output
    shapes) and return a caller that goes through the custom op only while torch.compile traces, so
    the graph holds one opaque node, and calls `fn` straight in eager mode, where the custom op's
    dispatch costs more than a small kernel (about 10 us a call on the CPU)."""

    def wrap(fn):
        op = torch.library.custom_op(f"fastbert::{name}", mutates_args=())(fn)
        op.register_fake(fake)

        def call(*args):
            return op(*args) if torch.compiler.is_compiling() else fn(*args)

        call.custom_op = op
        return call

    return wrap


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd has to record an op on these inputs."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def seed_tensor(seed: Optional[int], generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The dropout seed as an int64 CPU tensor of shape [1] (drawn from torch's RNG when None)."""
    if seed is None:
        return new_seed(generator)
    if isinstance(seed, torch.Tensor):
        return seed.reshape(1).to(device="cpu", dtype=torch.int64)
    return torch.tensor([check_seed(seed)], dtype=torch.int64)
