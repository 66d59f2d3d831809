"""The counter-based random numbers of every fastbert backend (Philox-4x32-10) and the dropout rule.

Dropout everywhere in fastbert uses one counter-based rule, so every backend draws the same mask
from the same seed (and the backward regenerates it instead of storing it):
    element (row r, col c) of the op's [rows, cols] view has counter offset = r * cols + c;
    u = word 0 of Philox-4x32-10 with counter (lo32(offset), hi32(offset), 0, 0), key (lo32(seed), hi32(seed))
        (exactly triton.language.randint(seed, offset));
    the element is kept when (u >> 8) >= dropout_threshold(p) = floor(p * 2**24), scaled by 1 / (1 - p).
Attention dropout (on the softmax probabilities) uses the same rule with its own counter:
    probability (sequence b, head h, query i, key j) has offset = (b * heads + h) * 2**32 + i * 2**16 + j,
    i and j counted from the sequence's first real token (so the padded and the packed layouts of a
    batch draw the same mask); sequences are at most 2**16 tokens long when dropout is on.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

_M32 = 0xFFFFFFFF
_PHILOX_ROUND_A = 0xD2511F53
_PHILOX_ROUND_B = 0xCD9E8D57
_PHILOX_KEY_A = 0x9E3779B9
_PHILOX_KEY_B = 0xBB67AE85


def _mulhilo(a: int, b: torch.Tensor):
    """(high 32 bits, low 32 bits) of a * b for a uint32 constant and a tensor of uint32 in int64."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b >> 16, b & 0xFFFF
    lo_lo = a_lo * b_lo
    mid1 = a_hi * b_lo
    mid2 = a_lo * b_hi
    hi_hi = a_hi * b_hi
    mid = (lo_lo >> 16) + (mid1 & 0xFFFF) + (mid2 & 0xFFFF)
    lo = ((mid & 0xFFFF) << 16) | (lo_lo & 0xFFFF)
    hi = hi_hi + (mid1 >> 16) + (mid2 >> 16) + (mid >> 16)
    return hi & _M32, lo & _M32


def check_seed(seed) -> int:
    """`seed` as an int, checked to lie in [0, 2**63) (the range every backend takes)."""
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"fastbert: dropout seed must be in [0, 2**63), got {seed}")
    return int(seed)


def philox_uint32(seed, offsets: torch.Tensor) -> torch.Tensor:
    """Philox-4x32-10 word 0 for each int64 counter in `offsets` (uint32 values held in int64).

    `seed` is a Python int in [0, 2**63) or a one-element int64 tensor (traceable by torch.compile).
    Bit-identical to triton.language.randint(seed, offsets) and to the C++ extension.
    """
    if isinstance(seed, torch.Tensor):
        seed = seed.reshape(()).to(device=offsets.device, dtype=torch.int64)
    else:
        seed = check_seed(seed)
    offsets = offsets.to(torch.int64)
    c0 = offsets & _M32
    c1 = (offsets >> 32) & _M32
    c2 = torch.zeros_like(offsets)
    c3 = torch.zeros_like(offsets)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _PHILOX_KEY_A) & _M32
        k1 = (k1 + _PHILOX_KEY_B) & _M32
    return c0


def dropout_threshold(p: float) -> int:
    """The 24-bit threshold below which a random word drops its element (see the module docstring)."""
    return int(math.floor(p * (1 << 24)))


def dropout_keep_mask(seed, shape: Sequence[int], p: float, device=None) -> torch.Tensor:
    """Bool mask of kept elements for an op whose inputs have `shape` (last dim = cols)."""
    shape = tuple(shape)
    n = math.prod(shape)
    offsets = torch.arange(n, dtype=torch.int64, device=device)
    u = philox_uint32(seed, offsets)
    return ((u >> 8) >= dropout_threshold(p)).reshape(shape)


def new_seed(generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A fresh dropout seed, an int64 tensor of shape [1] drawn from torch's CPU random state
    (torch.manual_seed makes runs repeatable; a tensor, not an int, so torch.compile traces it)."""
    return torch.randint(0, 2**62, (1,), generator=generator, dtype=torch.int64)
