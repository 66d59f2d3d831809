"""The build report's list of attention variants, `report_configs`: every (kernel, settings,
dtype, head dim block, flags, rotary or not, window or not, relative bias or not) the launchers
of `fastbert.kernels.attention` can compile, as KernelBuild records with the argument types and
the divisibility the JIT gives them at launch.
"""
from __future__ import annotations

from typing import Dict, Iterator

import torch
import triton

from .. import KernelBuild, Settings
from .backward import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel, attention_bwd_preprocess_kernel
from .common import mask_range_kernel
from .forward import attention_fwd_kernel
from .settings import BLOCK_DS, HEAD_DIMS, RANGE_SETTINGS, block_d, settings

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# arguments the kernels do not specialize (do_not_specialize): never marked divisible
_UNSPECIALIZED = {"stride_lb", "stride_lh", "stride_mb", "KEEP", "MASK", "RANGES", "CU_SEQLENS", "REL", "DREL", "rel_n",
                  "window", "rows_total", "DPK", "DPQ", "pos_n"}
# (HAS_MASK, VARLEN, EVEN) the launchers pick: no mask and whole tiles, padded with a key mask
# (also any other S without one), packed
_MODES = ((False, False, True), (True, False, False), (False, True, False))
# (WINDOW, REL_BIAS): neither, the window (ModernBERT's local layers), the relative bias (MPNet), both
_DISTANCE = ((False, False), (True, False), (False, True), (True, True))


def _arg_type(name: str, dt: str) -> str:
    if name in ("LSE", "DELTA", "ROPE_COS", "ROPE_SIN", "REL", "DREL", "DPK", "DPQ"):
        return "*fp32"
    if name == "IDX":
        return "*i32"
    if name in ("KEEP", "MASK"):
        return "*u1"
    if name in ("RANGES", "CU_SEQLENS"):
        return "*i32"
    if name.isupper():
        return f"*{dt}"
    if name == "seed":
        return "i64"
    if name.endswith("scale"):
        return "fp32"
    return "i32"  # strides, sizes, threshold


def kernel_build(name: str, fn, s: Settings, dt: str, constexprs: Dict[str, object], config: Dict[str, object]):
    """The KernelBuild of one variant of `fn`: its argument types by name and the divisibility the JIT gives them."""
    while isinstance(fn, triton.runtime.Heuristics):
        fn = fn.fn  # the jit (or, interpreted, the interpreter's) function under @triton.heuristics
    signature = {a: _arg_type(a, dt) for a in fn.arg_names if a not in constexprs}
    # every pointer and stride of q, k, v, do and the outputs is a multiple of 16 (_aligned), and
    # so is head_dim
    divisible = tuple(a for a, ty in signature.items() if a not in _UNSPECIALIZED
                      and (ty.startswith("*") or a.startswith("stride") or a == "head_dim"))
    return KernelBuild(name, fn, signature, constexprs, s.num_warps, s.num_stages, config, divisible, s.maxnreg)


def report_configs() -> Iterator[KernelBuild]:
    """Every (kernel, settings, dtype, head dim block, flags) the launchers can pick."""
    s = RANGE_SETTINGS
    yield kernel_build("attention_mask_range", mask_range_kernel, s, "fp32", {"BLOCK": s.block_n},
                 {"BLOCK_N": s.block_n})
    for dt, dtype in _DTYPES.items():
        precision = "tf32x3" if dtype == torch.float32 else "ieee"
        for bd in BLOCK_DS:
            dims = ",".join(str(d) for d in HEAD_DIMS if block_d(d) == bd)
            head_dim = next(d for d in HEAD_DIMS if block_d(d) == bd)
            s = settings(head_dim, dtype, "bwd_preprocess")
            yield kernel_build("attention_bwd_preprocess", attention_bwd_preprocess_kernel, s, dt,
                         {"BLOCK_M": s.block_m, "BLOCK_D": bd},
                         {"dtype": dt, "head_dims": dims, "BLOCK_M": s.block_m, "BLOCK_D": bd})
            for kernel, fn in (("fwd", attention_fwd_kernel), ("bwd_dkdv", attention_bwd_dkdv_kernel),
                               ("bwd_dq", attention_bwd_dq_kernel)):
                for rope in (False, True):
                    for window, rel in _DISTANCE:
                        yield from _variants(kernel, fn, dt, precision, bd, dims, rope, window, rel,
                                             settings(head_dim, dtype, kernel, rope, window or rel))


def _variants(kernel: str, fn, dt: str, precision: str, bd: int, dims: str, rope: bool, window: bool, rel: bool,
              s: Settings):
    # the layouts and flags of one kernel at one dtype, head dim block, ROPE, WINDOW and REL_BIAS
    for has_mask, varlen, even in _MODES:
        for has_dropout, return_mask in ((False, False), (True, False), (True, True)):
            if return_mask and (kernel != "fwd" or even):
                continue  # the debug mask: forward only, never the EVEN variant
            constexprs = {"BLOCK_M": s.block_m, "BLOCK_N": s.block_n, "BLOCK_D": bd,
                          "HAS_MASK": has_mask, "VARLEN": varlen, "HAS_DROPOUT": has_dropout,
                          "ROPE": rope, "WINDOW": window, "REL_BIAS": rel, "EVEN": even, "DOT_PRECISION": precision}
            config = {"dtype": dt, "head_dims": dims, "BLOCK_M": s.block_m, "BLOCK_N": s.block_n,
                      "BLOCK_D": bd, "mask": has_mask, "varlen": varlen, "even": even,
                      "dropout": has_dropout, "rope": rope, "window": window, "rel_bias": rel}
            if kernel == "fwd":
                constexprs["RETURN_MASK"] = return_mask
                config["return_mask"] = return_mask
            yield kernel_build(f"attention_{kernel}", fn, s, dt, constexprs, config)
