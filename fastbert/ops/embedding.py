"""embedding(input_ids, weight, padding_idx) = F.embedding, with a CPU backward whose dense weight
gradient [vocab, hidden] comes from the C++ extension's reusing allocator.

The word-embedding gradient of BERT-base is 30522 x 768 fp32, 94 MB, made afresh at every backward
(zeros, then the rows of the batch added in). From malloc that block is mapped anew each step and
page-faulted in 4 KiB at a time: its zero fill then takes many times what it takes in reused memory,
a visible share of a fine-tuning step (benchmarks/bench_finetune.py under torch.profiler:
benchmarks/LOG.md, "After the measured GEMM paths in training"). The extension keeps freed blocks
of 4 MiB and more mapped for the next request of that size, so from the second step on the
gradient lands in memory already faulted in. The values are F.embedding's: the gradient rows of
equal ids summed, the padding row zero.
Off the CPU, while compiling, without the extension, when weight needs no gradient, or for other
dtypes than fp32, bf16 and fp16: F.embedding. (The model calls nn.Embedding itself for a module
with max_norm, scale_grad_by_freq or sparse set.)
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from fastbert import backend as fb_backend


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_ids, weight, padding_idx, empty):
        ctx.save_for_backward(input_ids)
        ctx.shape, ctx.padding_idx, ctx.empty = weight.shape, padding_idx, empty
        return F.embedding(input_ids, weight, padding_idx)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (input_ids,) = ctx.saved_tensors
        dw = ctx.empty(list(ctx.shape), dy.dtype).zero_()
        dw.index_add_(0, input_ids.reshape(-1), dy.reshape(-1, ctx.shape[1]))
        if ctx.padding_idx is not None:
            dw[ctx.padding_idx] = 0
        return None, dw, None, None


def embedding(input_ids: torch.Tensor, weight: torch.Tensor, padding_idx: Optional[int] = None) -> torch.Tensor:
    """weight[input_ids] ([..., hidden]); the gradient of weight as F.embedding's (see the module docstring)."""
    empty = fb_backend.cpp_function("empty") if weight.device.type == "cpu" else None
    if (empty is None or torch.compiler.is_compiling() or not torch.is_grad_enabled() or not weight.requires_grad
            or weight.dtype not in (torch.float32, torch.bfloat16, torch.float16)):
        return F.embedding(input_ids, weight, padding_idx)
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return _Embedding.apply(input_ids, weight, padding_idx, empty)
