"""Shared pieces of the functional ops: the custom-op wrapper, autograd and layout helpers, seeds
(input checks: fastbert.ops.checks)."""
from __future__ import annotations

from typing import Optional

import torch

from fastbert.reference import check_seed, new_seed


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """A contiguous [rows, hidden] view of t (a copy only when t is not contiguous)."""
    return t.contiguous().view(-1, t.shape[-1])


def fused_op(name: str, fake):
    """Register `fn` as the torch.library custom op fastbert::<name> (with `fake` for its output
    shapes) and return a caller that goes through the custom op only while torch.compile traces, so
    the graph holds one opaque node, and calls `fn` straight in eager mode, where the custom op's
    dispatch costs more than a small kernel on the CPU. Under torch.profiler the eager call is
    recorded as fastbert::<name>, so a profile names fastbert's kernels."""

    def wrap(fn):
        op = torch.library.custom_op(f"fastbert::{name}", mutates_args=())(fn)
        op.register_fake(fake)
        label = f"fastbert::{name}"

        def call(*args):
            if torch.compiler.is_compiling():
                return op(*args)
            if torch.autograd.profiler._is_profiler_enabled:
                with torch.profiler.record_function(label):
                    return fn(*args)
            return fn(*args)

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


def seed_int(seed: Optional[torch.Tensor]) -> int:
    """The seed tensor of seed_tensor as the int the fused launchers take (0 when there is none)."""
    return 0 if seed is None else int(seed.item())
