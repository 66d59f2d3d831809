"""Launch settings of the add + LayerNorm kernels, read alike by the launchers and by
`report_configs` of `fastbert.kernels.layer_norm`: the widest row they take, the tile shape and
launch options of the forward and of the whole-row backward for a row width, the fixed settings
of the two column-chunked passes that the backward takes for wider rows and its grid size; and
the launch arguments of an optional tensor and the variants they give the report.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Tuple

from . import Settings, next_power_of_2

MAX_N = 8192  # the forward holds a whole row in registers
_MIN_BLOCK_N = 64  # narrower rows are padded (masked) to 64 lanes: LayerNorm widths are >= 128
_ROW_TILE = 1024  # forward: rows narrower than this are batched BLOCK_M to a program
_MAX_FUSED_BWD_N = 4096  # backward: whole rows up to this width, two passes above it
_MAX_FUSED_BWD_DSUM_N = 2048  # the same with the sum's gradient to add (HAS_DSUM)
PROGRAMS_PER_SM = 4  # backward grid size: programs per SM (rows x column tiles)
# the two passes of the backward for rows wider than _MAX_FUSED_BWD_N
ROW_SUMS_SETTINGS = Settings(block_m=1, block_n=1024, num_warps=4, num_stages=1, maxnreg=None)
TILED_SETTINGS = Settings(block_m=1, block_n=1024, num_warps=4, num_stages=1, maxnreg=None)


@functools.lru_cache(maxsize=None)  # (at most 4 entries a width) the launchers ask at every call
def settings(n_cols: int, backward: bool = False, with_sum: bool = False) -> Optional[Settings]:
    """Tile shape and launch options for a [*, n_cols] problem, 1 <= n_cols <= MAX_N.

    forward:  a tile of BLOCK_M rows x BLOCK_N (a power of 2 >= N) columns per program, at most
              16 elements per thread (4 warps up to 1K elements, 8 up to 4K, 16 at 8K).
    backward: one whole row at a time, 8 elements per thread (1 warp per 256 columns, at least
              one), since it holds more tiles at once plus the dweight / dbias accumulators;
              ptxas gets every register a thread can have at that size (65536 / threads, at
              most 255) rather than its default budget, which spills. Rows wider than
              _MAX_FUSED_BWD_N do not fit (32 warps leave 64 registers a thread): they take two
              column-chunked passes instead (ROW_SUMS_SETTINGS, TILED_SETTINGS), and this
              returns None for them.
    with_sum: the forward also writes h (HAS_SUM): at 16 warps ptxas gets all 128 registers a
              thread can have (its default budget, 64, spills the store's addresses when N is
              not a multiple of 16); the backward also adds h's gradient (HAS_DSUM): whole rows
              up to _MAX_FUSED_BWD_DSUM_N only (at 4096, 128 registers a thread spill).
    """
    if not 1 <= n_cols <= MAX_N:
        raise ValueError(f"fastbert: add_layer_norm supports 1 <= N <= {MAX_N} columns, got {n_cols}")
    block_n = max(next_power_of_2(n_cols), _MIN_BLOCK_N)
    if backward:
        if block_n > (_MAX_FUSED_BWD_DSUM_N if with_sum else _MAX_FUSED_BWD_N):
            return None
        num_warps = max(1, block_n // 256)
        return Settings(1, block_n, num_warps, 1, min(255, 65536 // (32 * num_warps)))
    block_m = max(1, _ROW_TILE // block_n)
    tile = block_m * block_n
    num_warps = 4 if tile <= 1024 else 8 if tile <= 4096 else 16
    return Settings(block_m, block_n, num_warps, 1, 65536 // (32 * num_warps) if with_sum and num_warps == 16 else None)


# The optional [M, N] tensor of a kernel (the forward's h, written out; the backward's gradient of
# it): its flag, pointer and row stride.
_OPTIONAL_ROWS = (("HAS_SUM", "S", "stride_sm"), ("HAS_DSUM", "DSUM", "stride_dsm"))


def optional_rows(t) -> Tuple[Any, Any]:
    """(pointer, row stride) kernel arguments of an optional [M, N] tensor; (None, None) when absent,
    which the JIT compiles as constants: the kernel is then the one without that feature."""
    return (None, None) if t is None else (t, t.stride(0))


def optional_rows_args(arg_names, x_dt: str, present: bool) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(constexprs, runtime argument types) of the optional tensor of a kernel with these arguments,
    present or absent (pointer and stride None, as optional_rows passes them); ({}, {}) for a
    kernel without one."""
    for flag, ptr, stride in _OPTIONAL_ROWS:
        if flag in arg_names:
            return ({flag: True}, {ptr: f"*{x_dt}", stride: "i32"}) if present else ({flag: False, ptr: None, stride: None}, {})
    return {}, {}
