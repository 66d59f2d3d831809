"""Input validators shared by every public entry point (ops, masking, the model, the collator):
each raises one readable TypeError / ValueError that starts with where it was called from.

`where` is the public name of the caller ("fastbert.masking.mask_tokens", "fastbert.BertModel");
a bare op name ("bias_gelu") stands for "fastbert.ops.<op>".
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def where_of(op: str) -> str:
    return op if op.startswith("fastbert") else f"fastbert.ops.{op}"


def check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where_of(op)}: {name} must be a torch.Tensor, got {type(t).__name__}")


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    check_tensor(op, name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{where_of(op)}: {name} has dtype {t.dtype}; supported: float32, float16, bfloat16")


def check_device(op: str, name: str, t: torch.Tensor, x: torch.Tensor, like: str = "x") -> None:
    """`t` is on the device of `x` (`like` names x in the error)."""
    if t.device != x.device:
        raise ValueError(f"{where_of(op)}: {name} is on {t.device} but {like} is on {x.device}")


def check_vector(op: str, name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    """`t` is a per-feature parameter of x: shape [hidden], dtype x's or float32, x's device."""
    check_float(op, name, t)
    n = x.shape[-1]
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(
            f"{where_of(op)}: {name} has shape {tuple(t.shape)} but x has hidden size {n} "
            f"(x.shape = {tuple(x.shape)}); {name} must have shape ({n},)"
        )
    if t.dtype not in (x.dtype, torch.float32):
        raise TypeError(
            f"{where_of(op)}: {name} has dtype {t.dtype} but x has dtype {x.dtype}; {name} must be {x.dtype} or float32"
        )
    check_device(op, name, t, x)


GELU_APPROXIMATIONS = ("none", "tanh")  # the exact erf GELU, or its tanh approximation


def check_approximate(op: str, approximate) -> None:
    """`approximate` names a GELU form the fused kernels compute."""
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"{where_of(op)}: approximate must be 'none' or 'tanh', got {approximate!r}")


def check_ids(op: str, name: str, t) -> None:
    """`t` is a tensor of integer token ids (any integer dtype; not bool, float or complex)."""
    check_tensor(op, name, t)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{where_of(op)}: {name} must hold integer ids (int64, int32, ...), got {t.dtype}")


def check_shape_like(op: str, name: str, t: torch.Tensor, shape: Sequence[int], like: str = "input_ids") -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"{where_of(op)}: {name} has shape {tuple(t.shape)} but {like} has shape {tuple(shape)}; they must match"
        )


def check_range(op: str, name: str, t: torch.Tensor, upper: int, what: str) -> None:
    """Every value of `t` lies in [0, upper) (`what` says where upper comes from)."""
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= upper:
            raise ValueError(f"{where_of(op)}: {name} must be in [0, {upper}) ({what}), got values in [{lo}, {hi}]")


def check_binary_mask(op: str, name: str, mask) -> torch.Tensor:
    """A 0/1 mask (bool, integer, or floating holding only 0 and 1) as a bool tensor."""
    check_tensor(op, name, mask)
    if mask.is_complex():
        raise TypeError(f"{where_of(op)}: {name} has dtype {mask.dtype}; it must be bool or integer")
    if mask.dtype == torch.bool:
        return mask
    if mask.numel() and not ((mask == 0) | (mask == 1)).all():
        meaning = " (0 = padding, 1 = real token)" if name == "attention_mask" else ""
        raise ValueError(f"{where_of(op)}: {name} must be in {{0, 1}}: only 0 and 1{meaning}")
    return mask != 0


def check_mask(op: str, name: str, mask) -> torch.Tensor:
    """A mask read as nonzero / zero, as a bool tensor: bool or any integer dtype as given, floating
    only when it holds nothing but 0 and 1 (a fractional "mask" is a mistake, not a weight)."""
    check_tensor(op, name, mask)
    if mask.is_floating_point() or mask.is_complex():
        return check_binary_mask(op, name, mask)
    return mask if mask.dtype == torch.bool else mask != 0


def check_int(op: str, name: str, value, lo: int, hi: Optional[int] = None, hi_name: str = "") -> int:
    """`value` as an int in [lo, hi) (hi_name spells hi in the error)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype in _INT_DTYPES:
            value = int(value)
        else:
            raise TypeError(f"{where_of(op)}: {name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value >= hi):
        bound = f"[{lo}, {hi_name or hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"{where_of(op)}: {name} = {value} is outside {bound}")
    return value


def check_prob(op: str, name: str, p) -> float:
    """`p` as a float in [0, 1] (NaN rejected)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{where_of(op)}: {name} must be a float in [0, 1], got {type(p).__name__} {p!r}")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{where_of(op)}: {name} must be in [0, 1], got {p}")
    return p
