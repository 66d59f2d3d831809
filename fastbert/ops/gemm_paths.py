"""The CPU GEMM paths themselves: y = a @ b^T (+ bias) on one library's kernel each, and which
role and dtype each takes on this build (fastbert.ops.gemm times them and picks one per shape).
Each takes (a, b, bias, alloc); alloc, when not None, makes an output the path may write into.

    addmm          torch.addmm / torch.mm: torch's own CPU GEMM (MKL or OpenBLAS in fp32, oneDNN in bf16)
    onednn         torch.ops.mkldnn._linear_pointwise: oneDNN's inner product on the weight as it is
    onednn_packed  the same on a weight reordered into oneDNN's blocked layout (roles fwd and dx)
    mkl_packed     torch.ops.mkl._mkl_linear on an MKL-packed weight (fp32, role fwd)
    dot            fastbert's own fp32 GEMM (csrc/kernels/dot_gemm_kernel.cpp, role fwd): each output the dot
                   product of a row of a and a row of the weight, read as it lies in memory. Nothing
                   is packed, so with few rows (a batch of one short query), where the packing
                   libraries spend more time on the weight than on the multiply-adds, it is the
                   fastest; with many rows a packed kernel wins
    fp32           (bf16 and fp16) the product in fp32 on the fastest fp32 path, operands converted on
                   every call and the result rounded back: on a CPU without native bf16 (no
                   AVX512_BF16, no AMX) torch's bf16 GEMM is several times slower than fp32
                   (benchmarks/LOG.md, "bf16 on a CPU without native bf16"); when this
                   path wins fastbert says so once (bf16 then saves memory, not time)

and for int8 inference (a and b int8, role fwd, no bias: the int32 accumulator acc = a @ b^T, whose
dequantization the consuming op applies, see fastbert.ops.int8):

    fastbert       fastbert's own int8 GEMM (csrc/kernels/int8_gemm.cpp) at the kernels' level:
                   vpdpbusd with VNNI; at avx2 vpmaddubsw (u8 x s8 pairs into 16 bits) on |a| and
                   the weight with a's sign, which no pair of products overflows unless a weight is
                   -128 (then, and at avx512, int16 pairs into int32 with vpmaddwd); exact on every
                   CPU (AVX2's u8 x s8 instruction saturates on a + 128 against larger weights,
                   which is why oneDNN's path below fails its probe on CPUs without VNNI)
    int_mm         torch._int_mm (oneDNN's s8 x s8 -> s32 matmul on x86); also what torchao's int8
                   dynamic-activation / int8-weight linear calls on the CPU
    onednn_qlinear torch.ops.onednn.qlinear_pointwise on a weight prepacked on every call, with the
                   activations moved to u8 (+128, oneDNN's zero point; its fast kernels take u8 x s8)
                   and the accumulator returned as float32
    float          the product in fp32 (both operands converted on every call, then the fastest float
                   path), accumulator float32: exact while |acc| < 2**24, within fp32 rounding beyond.
                   Timed with the others, so an int8 layer never runs a product slower than fp32 would;
                   when it wins, fastbert says so once (no int8 GEMM here beats fp32: the model gains
                   nothing from quantize="int8" on this CPU)

An int8 weight stored packed (fastbert.ops.int8.int8_layout) has no choice: fastbert's packed int8
GEMM (csrc/kernels/int8_gemm_packed.cpp) reads it as it lies."""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from fastbert import backend as fb_backend

# oneDNN keeps every primitive it creates, one per shape, in a cache of 1024 by default, each with
# its own compiled kernel, and torch's oneDNN linear (ideep) keeps another 1024 of its own
# (LRU_CACHE_CAPACITY): the onednn paths in a loop whose row count changes at every batch (a
# sentence encoder's, a server's) add to both at every batch, and the process grows with every
# batch shape it meets until they are full (hundreds of MiB; benchmarks/RESULTS.md). A batch reuses
# its own few primitives across its layers; what a later batch could reuse is rare and cheap to
# build again. Both capacities are read once, at the first primitive: a value the user set, or a
# primitive created before fastbert was imported, keeps its own.
ONEDNN_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
for _name in ONEDNN_CACHES:
    os.environ.setdefault(_name, "64")

Tensor = torch.Tensor
Alloc = Optional[Callable[[], Tensor]]
_CPP = {"fastbert": "int8_gemm", "dot": "f32_dot_gemm"}


def addmm(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    out = None if alloc is None else alloc()
    if bias is None:
        return torch.mm(a, b.t(), out=out)
    return torch.addmm(bias, a, b.t(), out=out)


def onednn(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


def onednn_packed(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    packed = torch.ops.mkldnn._reorder_linear_weight(b.contiguous(), a.shape[0])
    return torch.ops.mkldnn._linear_pointwise(a, packed, bias, "none", [], "")


def mkl_packed(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    packed = torch.ops.mkl._mkl_reorder_linear_weight(b, a.shape[0])
    return torch.ops.mkl._mkl_linear(a, packed, b, bias, a.shape[0])


def int_mm(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    return torch._int_mm(a, b.t(), out=None if alloc is None else alloc())


def onednn_qlinear(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    packed = torch.ops.onednn.qlinear_prepack(b, [a.shape[0], a.shape[1]])
    ones = torch.ones(b.shape[0], dtype=torch.float32)
    zeros = torch.zeros(b.shape[0], dtype=torch.int64)
    a_u8 = a.view(torch.uint8).bitwise_xor(128)  # the bits of a + 128 as uint8
    return torch.ops.onednn.qlinear_pointwise(a_u8, 1.0, 128, packed, ones, zeros, None, 1.0, 0, torch.float32,
                                              "none", [], "")


def fastbert_int8(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    return fb_backend.cpp_function("int8_gemm")(a, b, None if alloc is None else alloc())


def dot(a: Tensor, b: Tensor, bias: Optional[Tensor], alloc: Alloc) -> Tensor:
    """fastbert's fp32 dot-product GEMM (csrc/kernels/dot_gemm_kernel.cpp): the weight read as it lies, nothing
    packed, so for few rows (a batch of one short query) no pass over the weight is added to the
    one the product needs."""
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    return fb_backend.cpp_function("f32_dot_gemm")(a, b, bias, None if alloc is None else alloc())


def offered(path: str, role: str, dtype: torch.dtype) -> bool:
    """Whether this build has the path (torch's op, fastbert's kernel) and the path takes this role
    and dtype (a dtype of its kind: float for gemm.FLOAT_PATHS, int8 for gemm.INT8_PATHS)."""
    if path in ("fastbert", "dot"):
        dtype_ok = dtype == (torch.int8 if path == "fastbert" else torch.float32)
        return (role == "fwd" and dtype_ok and fb_backend.cpp_available()
                and fb_backend.cpp_function(_CPP[path]) is not None)
    if path == "float":
        return role == "fwd"
    if path == "int_mm":
        return role == "fwd" and hasattr(torch, "_int_mm")
    if path == "onednn_qlinear":
        return (role == "fwd" and torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.onednn, "qlinear_pointwise") and hasattr(torch.ops.onednn, "qlinear_prepack"))
    if path == "addmm":
        return True
    if path == "fp32":
        return dtype in (torch.bfloat16, torch.float16)
    if path.startswith("onednn"):
        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
            return False
        return role != "dw" if path == "onednn_packed" else True
    return (role == "fwd" and dtype == torch.float32 and torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_linear"))
