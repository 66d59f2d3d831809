"""linear(x, weight, bias) = x @ weight^T + bias, as F.linear, for the model's projections.

For inference on the CPU the output of 4 MiB or more comes from the C++ extension's reusing
mapping allocator instead of malloc: glibc maps such a block afresh on every call and the GEMM then
page-faults it in 4 KiB at a time (at 8982 x 1536 fp32 that took 44 ms a call against 31 ms into a
reused buffer; the bias an addmm first copies into its output pays the faults too). Under autograd,
under autocast (which picks the GEMM's dtype), while compiling, off the CPU, for empty inputs or
without the extension: F.linear.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from fastbert import backend as _backend


def _plain(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether F.linear is the path: autograd records, torch.compile traces, or nothing to gain."""
    return (
        x.device.type != "cpu" or x.numel() == 0 or x.dtype != weight.dtype or torch.compiler.is_compiling()
        or torch.is_autocast_enabled("cpu")
        or (torch.is_grad_enabled()
            and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)))
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T + bias [out] -> [..., out] (F.linear's values)."""
    if _plain(x, weight, bias):
        return F.linear(x, weight, bias)
    empty = _backend.cpp_function("empty")
    if empty is None:
        return F.linear(x, weight, bias)
    out = empty([*x.shape[:-1], weight.shape[0]], x.dtype)
    x2, out2 = x.reshape(-1, x.shape[-1]), out.view(-1, weight.shape[0])
    if bias is None:
        torch.mm(x2, weight.t(), out=out2)
    else:
        torch.addmm(bias, x2, weight.t(), out=out2)
    return out
