"""Shared pieces of the functional ops: the custom-op wrapper, autograd and layout helpers, seeds
(input checks: fastbert.ops.checks)."""
from __future__ import annotations

from typing import Optional

import torch

from fastbert.kernels import outputs_apart
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
        def for_op(*args):
            # torch requires a custom op's outputs not to share memory; called straight, the
            # launchers may give several from one allocation (fastbert.kernels.empty_together)
            with outputs_apart():
                return fn(*args)

        op = torch.library.custom_op(f"fastbert::{name}", mutates_args=())(fn)
        op.register_kernel(("cpu", "cuda"), for_op)
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


def op_seed(seed, generator: Optional[torch.Generator] = None):
    """The dropout seed as the ops carry it: while torch.compile traces, an int64 CPU tensor of
    shape [1] (an input of the graph, not a constant baked into it); in eager mode a plain int, so
    that neither the forward nor the backward reads a tensor on the host. Drawn from torch's RNG
    (or `generator`) when None."""
    if torch.compiler.is_compiling():
        if seed is None:
            return new_seed(generator)
        if isinstance(seed, torch.Tensor):
            return seed.reshape(1).to(device="cpu", dtype=torch.int64)
        return torch.tensor([check_seed(seed)], dtype=torch.int64)
    if seed is None:
        return int(new_seed(generator).item())
    return check_seed(seed.item() if isinstance(seed, torch.Tensor) else seed)


def seed_int(seed) -> int:
    """The seed of op_seed as the int the fused launchers take (0 when there is none)."""
    if seed is None:
        return 0
    return seed if isinstance(seed, int) else int(seed.item())


def save_seed(ctx, seed) -> Optional[torch.Tensor]:
    """An autograd Function's dropout seed kept for its backward: an int on ctx, a traced tensor
    returned for ctx.save_for_backward (None for an int); saved_seed gives it back."""
    if isinstance(seed, torch.Tensor):
        ctx.seed = None
        return seed
    ctx.seed = seed
    return None


def saved_seed(ctx, saved: Optional[torch.Tensor]):
    """The seed save_seed kept: the saved tensor, or the int on ctx."""
    return saved if saved is not None else ctx.seed


_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


class DropoutSeeds:
    """The dropout seeds of one layer call: one draw from torch's RNG (or `generator`), taken when
    the first dropout asks, and every seed after it derived from that draw (splitmix64), so that a
    layer's dropouts cost the host one draw, not one per op. A layer makes a fresh one per call:
    torch.manual_seed repeats its seeds, and a checkpointed layer's recomputation (which restores
    the RNG) draws the same ones. While torch.compile traces, take() gives None and each op draws
    its own traced seed."""

    __slots__ = ("_base", "_count", "_generator")

    def __init__(self, generator: Optional[torch.Generator] = None) -> None:
        self._base: Optional[int] = None
        self._count = 0
        self._generator = generator

    def take(self, dropout_p: float) -> Optional[int]:
        """The next seed in [0, 2**63) for an op of dropout probability dropout_p (None when it is 0:
        no seed is used, none is drawn)."""
        if dropout_p <= 0 or torch.compiler.is_compiling():
            return None
        if self._base is None:
            self._base = int(new_seed(self._generator).item())
        self._count += 1
        z = (self._base + self._count * _GOLDEN) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return (z ^ (z >> 31)) >> 1
