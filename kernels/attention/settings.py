"""Launch settings of the attention kernels: the head dims they take and the head dim blocks
those round up to, one table of tile shapes and launch options per (kernel, 16-bit inputs?, head
dim block) and the rotary (ROPE) variants' departures from it, read alike by the launchers of
`fastbert.kernels.attention` and by the build report (`variants`), and the launch
argument the launchers derive from it (the input precision of the fp32 matrix products).
"""
from __future__ import annotations

import os
from typing import Dict, Tuple

import torch

from .. import Settings, next_power_of_2

HEAD_DIMS = (16, 32, 64, 80, 96, 128)  # the head dims the kernels take (multiples of 16)
_BLOCK_D = {d: max(32, next_power_of_2(d)) for d in HEAD_DIMS}  # block_d's answers (the launchers ask per kernel)
BLOCK_DS = (32, 64, 128)  # head dim blocks: D rounded up to a power of 2, at least 32
KERNELS = ("fwd", "bwd_preprocess", "bwd_dkdv", "bwd_dq")
RANGE_SETTINGS = Settings(block_m=1, block_n=256, num_warps=4, num_stages=1, maxnreg=None)

# (kernel, 16-bit inputs?, BLOCK_D) -> settings. Every variant compiles for sm_80 and sm_90 with
# no spills (python -m fastbert.kernels.report --kernels attention). fp32 tiles are small: Triton
# holds a whole dot operand of a warp in registers, and tf32x3 holds it twice (big and small parts).
_TABLE = {
    # forward: BLOCK_M queries per program against key tiles of BLOCK_N
    ("fwd", True, 32): Settings(128, 64, 8, 2, None),
    ("fwd", True, 64): Settings(128, 64, 8, 2, None),
    ("fwd", True, 128): Settings(128, 32, 8, 2, None),
    ("fwd", False, 32): Settings(64, 32, 4, 2, None),
    ("fwd", False, 64): Settings(32, 32, 4, 2, None),
    ("fwd", False, 128): Settings(16, 32, 4, 2, None),
    # delta = rowsum(dO * O): BLOCK_M rows per program
    ("bwd_preprocess", True, 32): Settings(128, 1, 4, 1, None),
    ("bwd_preprocess", True, 64): Settings(64, 1, 4, 1, None),
    ("bwd_preprocess", True, 128): Settings(32, 1, 4, 1, None),
    ("bwd_preprocess", False, 32): Settings(64, 1, 4, 1, None),
    ("bwd_preprocess", False, 64): Settings(32, 1, 4, 1, None),
    ("bwd_preprocess", False, 128): Settings(16, 1, 4, 1, None),
    # dk / dv: BLOCK_N keys per program, BLOCK_M queries per loop step
    ("bwd_dkdv", True, 32): Settings(64, 32, 4, 2, None),
    ("bwd_dkdv", True, 64): Settings(64, 32, 8, 2, None),
    ("bwd_dkdv", True, 128): Settings(32, 64, 8, 2, None),
    ("bwd_dkdv", False, 32): Settings(16, 32, 4, 2, None),
    ("bwd_dkdv", False, 64): Settings(32, 16, 4, 2, None),
    ("bwd_dkdv", False, 128): Settings(16, 16, 4, 2, None),
    # dq: BLOCK_M queries per program, BLOCK_N keys per loop step
    ("bwd_dq", True, 32): Settings(64, 64, 4, 2, None),
    ("bwd_dq", True, 64): Settings(64, 32, 8, 2, None),
    ("bwd_dq", True, 128): Settings(64, 32, 8, 2, None),
    ("bwd_dq", False, 32): Settings(16, 32, 4, 2, None),
    ("bwd_dq", False, 64): Settings(16, 32, 4, 2, None),
    ("bwd_dq", False, 128): Settings(16, 16, 4, 2, None),
}

# The ROPE variants' settings where they differ from _TABLE's (same key): the rotation of each
# loaded tile (its fp32 cos and sin, and the rotated copy the products read) needs registers, so
# these take smaller tiles or more warps. Chosen to compile with no spills on sm_80 and sm_90 (the
# build report), not timed.
_ROPE_TABLE: Dict[Tuple[str, bool, int], Settings] = {
    ("fwd", False, 64): Settings(32, 32, 8, 2, None),
    ("bwd_dkdv", True, 32): Settings(32, 64, 4, 2, None),
    ("bwd_dkdv", True, 64): Settings(32, 64, 8, 2, None),
    ("bwd_dkdv", True, 128): Settings(32, 32, 8, 2, None),
    ("bwd_dkdv", False, 64): Settings(32, 16, 8, 2, None),
    ("bwd_dkdv", False, 128): Settings(16, 16, 8, 2, None),
    ("bwd_dq", True, 32): Settings(64, 32, 4, 2, None),
    ("bwd_dq", True, 128): Settings(32, 32, 8, 2, None),
    ("bwd_dq", False, 32): Settings(16, 16, 4, 2, None),
    ("bwd_dq", False, 128): Settings(16, 16, 8, 2, None),
}

# The WINDOW / REL_BIAS variants' settings where they differ from those above (without and with
# ROPE): chosen, like _ROPE_TABLE's, to compile with no spills on sm_80 and sm_90, not timed.
_DISTANCE_TABLE: Dict[Tuple[str, bool, int], Settings] = {
    ("fwd", True, 32): Settings(128, 32, 8, 2, None),
    ("bwd_dkdv", True, 32): Settings(32, 32, 4, 2, None),
    ("bwd_dkdv", True, 128): Settings(32, 32, 8, 2, None),
    ("bwd_dkdv", False, 32): Settings(16, 16, 8, 2, None),
    ("bwd_dkdv", False, 64): Settings(32, 16, 8, 2, None),
    ("bwd_dkdv", False, 128): Settings(16, 16, 8, 2, None),
    ("bwd_dq", True, 128): Settings(32, 32, 8, 2, None),
}
_ROPE_DISTANCE_TABLE: Dict[Tuple[str, bool, int], Settings] = {
    ("fwd", True, 32): Settings(128, 32, 8, 2, None),
    ("fwd", True, 128): Settings(64, 32, 8, 2, None),
    ("fwd", False, 64): Settings(32, 32, 4, 2, None),
    ("bwd_dkdv", True, 32): Settings(32, 32, 4, 2, None),
    ("bwd_dkdv", True, 64): Settings(32, 16, 8, 2, None),
    ("bwd_dkdv", False, 32): Settings(16, 16, 4, 2, None),
    ("bwd_dkdv", False, 128): Settings(16, 16, 8, 3, None),
    ("bwd_dq", False, 32): Settings(16, 16, 8, 1, None),
}


def block_d(head_dim: int) -> int:
    """The head dim block of `head_dim`: a power of 2, at least 32 (columns past D are masked)."""
    found = _BLOCK_D.get(head_dim)
    if found is None:
        raise ValueError(f"fastbert: the Triton attention kernels take head_dim in {HEAD_DIMS}, got {head_dim}")
    return found


def settings(head_dim: int, dtype: torch.dtype, kernel: str, rope: bool = False, distance: bool = False) -> Settings:
    """Tile shape and launch options of `kernel` (one of KERNELS) for q.dtype `dtype` and `head_dim`,
    with rotary embeddings applied (the ROPE variants) when `rope`, and a window or a relative bias
    (the WINDOW / REL_BIAS variants) when `distance`."""
    if kernel not in KERNELS:
        raise ValueError(f"fastbert: unknown attention kernel {kernel!r}; one of {KERNELS}")
    key = (kernel, dtype != torch.float32, block_d(head_dim))
    found = _TABLE[key]
    if rope:
        found = _ROPE_TABLE.get(key, found)
    if distance:
        found = (_ROPE_DISTANCE_TABLE if rope else _DISTANCE_TABLE).get(key, found)
    return found


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 on the GPU: three TF32 tensor-core products (about fp32 accuracy); the interpreter
    # computes every product exactly in fp32 whatever this says
    if dtype == torch.float32 and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "tf32x3"
    return "ieee"
