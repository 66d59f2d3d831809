"""int8 inference ops: dynamic per-row quantization, the int8 GEMM, and the GEMM's dequantization
fused into the op that reads its output, which also quantizes what it writes for the next GEMM.

The scheme (exact rules in fastbert.reference.int8): weights int8 per output channel, symmetric;
activations int8 per token (row), about the row's midpoint; the GEMM accumulates in int32;
everything else (LayerNorm, softmax, GELU, residuals) runs in float. Quantized activations are
(q [rows + 1, n] int8, whose last row is ones, scale [rows], offset [rows]), and a GEMM accumulator
is [rows + 1, n], its last row the weight's column sums. One encoder layer on these ops:

    acc = int8_matmul(x_q, Wqkv_q)                               [tokens + 1, 3 hidden]
    qkv = int8_dequantize(acc, x_s, x_o, Wqkv_s, b, dtype)       -> attention -> ctx -> quantize_rows(ctx)
    acc = int8_matmul(ctx_q, Wo_q)
    h1, *h1_quantized = int8_add_layer_norm(acc, ctx_s, ctx_o, Wo_s, bo, x, ...)
    acc = int8_matmul(h1_q, Wi_q)
    i_q, i_s, i_o = int8_bias_gelu(acc, h1_s, h1_o, Wi_s, bi)       (a gated feed-forward: int8_glu)
    acc = int8_matmul(i_q, W2_q)
    h2, *h2_quantized = int8_add_layer_norm(acc, i_s, i_o, W2_s, b2, h1, ...)   (the next layer's input)

On the CPU the element-wise ops run the C++ kernels (csrc/int8.cpp) and int8_matmul the GEMM path
measured fastest for the shape (fastbert.ops.gemm: fastbert's own, torch._int_mm, oneDNN's quantized
linear or the float product).
There are no Triton int8 kernels: on other devices (and with backend="torch") the reference runs.
Inference only: none of these ops has a gradient.
"""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import torch

from fastbert import backend as fb_backend
from fastbert import layouts
from fastbert.ops import gemm, gemm_timing
from fastbert.ops.checks import check_approximate, check_float, check_tensor, where_of
from fastbert.ops.common import fused_op
from fastbert.reference import int8 as ref

Tensor = torch.Tensor


def _impl(backend: Optional[str], t: Tensor):
    """The extension's int8 kernels, or the reference where they do not run (fastbert.backend.cpu_only)."""
    ext = fb_backend.cpu_only(backend, t)
    return ref if ext is None else ext


def _check_acc(op: str, acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor,
               bias: Optional[Tensor]) -> None:
    check_tensor(op, "acc", acc)
    if acc.dim() != 2 or acc.shape[0] < 1 or acc.dtype not in (torch.int32, torch.float32):
        raise ValueError(f"{where_of(op)}: acc must be an int8_matmul output, int32 or float32 [rows + 1, n], got "
                         f"{acc.dtype} {tuple(acc.shape)}")
    rows, n = acc.shape[0] - 1, acc.shape[1]
    for name, t, size in (("row_scale", row_scale, rows), ("row_offset", row_offset, rows), ("col_scale", col_scale, n)):
        check_tensor(op, name, t)
        if t.dtype != torch.float32 or tuple(t.shape) != (size,):
            raise ValueError(f"{where_of(op)}: {name} must be float32 of shape ({size},), got {t.dtype} {tuple(t.shape)}")
    if bias is not None:
        check_float(op, "bias", bias)
        if tuple(bias.shape) != (n,):
            raise ValueError(f"{where_of(op)}: bias must have shape ({n},), got {tuple(bias.shape)}")


def _fake_quantize(x):
    rows, n = x.shape[0], x.shape[1]
    return (x.new_empty((rows + 1, n), dtype=torch.int8), x.new_empty((rows,), dtype=torch.float32),
            x.new_empty((rows,), dtype=torch.float32))


def _fake_rows(acc):
    return _fake_quantize(acc[:-1])


@fused_op("quantize_rows", _fake_quantize)
def _quantize_rows(x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(_impl(None, x).quantize_rows(x))


def quantize_rows(x: Tensor, *, backend: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """x [rows, n] float -> (q int8 [rows + 1, n], scale float32 [rows], offset float32 [rows]):
    x ~ q[:-1] * scale[:, None] + offset[:, None]; q's last row is ones (see the module docstring)."""
    check_float("quantize_rows", "x", x)
    if x.dim() != 2:
        raise ValueError(f"fastbert.ops.quantize_rows: x must be 2-D [rows, n], got shape {tuple(x.shape)}")
    x = x.contiguous()
    if backend is not None:
        return tuple(_impl(backend, x).quantize_rows(x))
    return _quantize_rows(x)


def quantize_weight(weight: Tensor, qmax: int = 127) -> Tuple[Tensor, Tensor]:
    """weight [out, in] float -> (q int8 [out, in], scale float32 [out]), per output channel, symmetric,
    q in [-qmax, qmax]: 127, or 64 (fastbert.layouts.WEIGHT_RANGES)."""
    check_float("quantize_weight", "weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"fastbert.ops.quantize_weight: weight must be 2-D [out, in], got {tuple(weight.shape)}")
    if qmax not in layouts.WEIGHT_RANGES:
        raise ValueError(f"fastbert.ops.quantize_weight: qmax must be one of {layouts.WEIGHT_RANGES}, got {qmax!r}")
    return layouts.quantize_weight(weight.detach(), qmax)


INT8_LAYOUTS = ("packed", "plain")
_layouts: Dict[tuple, Tuple[str, Dict[int, Dict[str, float]]]] = gemm_timing.cache()


def int8_layout() -> str:
    """How int8 layers store their weights here: "packed", the layout of fastbert's packed int8 GEMM
    (csrc/kernels/int8_gemm_packed.cpp: read as it lies, nothing packed on any call; the layer's only
    copy), or "plain" [out, in], which fastbert.ops.gemm's measured paths take. Measured once per
    (threads, kernel level) on a BERT-base-sized weight in [-127, 127], at 32 and 512 rows (a short query and a batch): the packed
    GEMM against the path fastbert.ops.gemm.product() measured fastest; packed where it is faster by
    the geometric mean of the two ratios (layout_of; 512 rows are not timed where packed is
    SLOW_INT8 times slower at 32: a level without the packed micro-kernel). `int8_layouts()` has the
    timings. FASTBERT_INT8_LAYOUT=packed or plain pins it; under a forced GEMM path (FASTBERT_GEMM,
    forced()) layers keep the plain layout that path takes."""
    pinned = os.environ.get("FASTBERT_INT8_LAYOUT")
    if pinned:
        if pinned not in INT8_LAYOUTS:
            raise ValueError(f"fastbert: FASTBERT_INT8_LAYOUT={pinned!r}: choose " + " or ".join(INT8_LAYOUTS))
        return pinned
    packed_gemm = fb_backend.cpp_function("int8_gemm_packed")
    if gemm.forced_name() is not None or packed_gemm is None:
        return "plain"
    key = gemm_timing.here()
    if key not in _layouts:
        g = torch.Generator().manual_seed(0)
        r = layouts.WEIGHT_RANGES[0]
        w = torch.randint(-r, r + 1, (768, 768), generator=g, dtype=torch.int8)
        wp = layouts.pack_weight(w)
        timed: Dict[int, Dict[str, float]] = {}
        for rows in (32, 512):
            a = torch.randint(-r, r + 1, (rows + 1, 768), generator=g, dtype=torch.int8)
            gemm.product("fwd", a, w)  # the plain layout's path measured first
            timed[rows] = gemm_timing.time_paths(
                ["packed", "plain"], lambda p, a=a: packed_gemm(a, wp) if p == "packed" else gemm.product("fwd", a, w))
            if timed[rows]["packed"] > gemm.SLOW_INT8 * timed[rows]["plain"]:
                break  # a level without the packed micro-kernel (its plain loop): not worth timing more
        _layouts[key] = (layout_of(timed), timed)
    return _layouts[key][0]


def layout_of(timed: Dict[int, Dict[str, float]]) -> str:
    """packed where its times over the plain layout's, at each row count timed, have a geometric mean
    of at most 1 (each size counts alike: a sum of times would be the 512 rows' alone)."""
    ratio = 1.0
    for t in timed.values():
        ratio *= t["packed"] / t["plain"]
    return "packed" if ratio ** (1 / len(timed)) <= 1.0 else "plain"


def stored_weight(q: Tensor, layout: Optional[str] = None) -> Tensor:
    """An int8 weight [out, in] as int8 layers keep it here: packed (pack_int8_weight) where the
    layout (None: int8_layout(), measured) is "packed", out is a multiple of 16 and q is on the CPU;
    else q itself. Either gives the same products (every int8 GEMM path is exact)."""
    if q.shape[0] % layouts.PANEL == 0 and q.device.type == "cpu" and (layout or int8_layout()) == "packed":
        return pack_int8_weight(q)
    return q


def int8_layouts() -> Dict[tuple, Tuple[str, Dict[int, Dict[str, float]]]]:
    """{(threads, kernel level): (int8 weight layout chosen, {rows: {layout: seconds timed}})}."""
    return dict(_layouts)


def pack_int8_weight(q: Tensor) -> Tensor:
    """An int8 weight [out, in] (out a multiple of 16) packed for int8_matmul's packed GEMM:
    [out / 16, ceil(in / 4), 16, 4] (fastbert.layouts.pack_weight has the layout). The packed
    tensor can be the weight's only copy: int8_matmul reads it as it lies, nothing derived is kept."""
    check_tensor("pack_int8_weight", "q", q)
    if q.dtype != torch.int8 or q.dim() != 2 or q.shape[0] % layouts.PANEL:
        raise ValueError(f"fastbert.ops.pack_int8_weight: needs an int8 [out, in] weight with out a multiple of "
                         f"{layouts.PANEL}, got {q.dtype} {tuple(q.shape)}")
    return layouts.pack_weight(q)


def unpack_int8_weight(packed: Tensor, in_features: int) -> Tensor:
    """pack_int8_weight's inverse: the int8 weight [out, in_features]."""
    if packed.dtype != torch.int8 or packed.dim() != 4 or tuple(packed.shape[1:]) != ((in_features + 3) // 4, 16, 4):
        raise ValueError(f"fastbert.ops.unpack_int8_weight: needs a packed int8 weight [out / 16, "
                         f"{(in_features + 3) // 4}, 16, 4] for {in_features} features, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    return layouts.unpack_weight(packed, in_features)


def int8_out_features(weight: Tensor) -> int:
    """The output features of an int8 weight, [out, in] or packed."""
    return weight.shape[0] * layouts.PANEL if weight.dim() == 4 else weight.shape[0]


def _alloc(rows: int, cols: int):
    empty = fb_backend.cpp_function("empty")
    return None if empty is None else (lambda: empty([rows, cols], torch.int32))


def int8_matmul(a: Tensor, weight: Tensor) -> Tensor:
    """a [rows, in] int8 @ weight [out, in]^T int8 -> the accumulator [rows, out] (int32, or float32
    on oneDNN's path; exact either way at BERT's sizes), on the GEMM path measured fastest here. A
    weight packed by pack_int8_weight runs fastbert's packed GEMM (int32)."""
    packed = weight.dim() == 4
    if a.dtype != torch.int8 or weight.dtype != torch.int8 or a.dim() != 2 or weight.dim() not in (2, 4):
        raise ValueError(f"fastbert.ops.int8_matmul: needs int8 [rows, in] and int8 [out, in] (or packed), got "
                         f"{a.dtype} {tuple(a.shape)} and {weight.dtype} {tuple(weight.shape)}")
    if weight.shape[1] != ((a.shape[1] + 3) // 4 if packed else a.shape[1]):
        takes = f"{4 * weight.shape[1] - 3} to {4 * weight.shape[1]}" if packed else str(weight.shape[1])
        raise ValueError(f"fastbert.ops.int8_matmul: a has {a.shape[1]} features but weight takes {takes}")
    if a.device.type != "cpu" or torch.compiler.is_compiling() or a.shape[0] == 0:
        return ref.int8_mm(a, weight)
    alloc = _alloc(a.shape[0], int8_out_features(weight))
    if packed:
        fn = fb_backend.cpp_function("int8_gemm_packed")
        if fn is None:
            return ref.int8_mm(a, weight)
        return fn(a.contiguous(), weight.contiguous(), None if alloc is None else alloc())
    return gemm.product("fwd", a.contiguous(), weight, None, alloc)


def _fake_dequantize(acc, row_scale, row_offset, col_scale, bias, dtype):
    return acc.new_empty((acc.shape[0] - 1, acc.shape[1]), dtype=dtype)


@fused_op("int8_dequantize", _fake_dequantize)
def _int8_dequantize(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Optional[Tensor],
                     dtype: torch.dtype) -> Tensor:
    return _impl(None, acc).int8_dequantize(acc, row_scale, row_offset, col_scale, bias, dtype)


def int8_dequantize(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor,
                    bias: Optional[Tensor] = None, dtype: torch.dtype = torch.float32, *,
                    backend: Optional[str] = None) -> Tensor:
    """The linear layer's output [rows, n] as `dtype`, from its accumulator acc [rows + 1, n]:
    (acc[:-1] * row_scale[:, None] + row_offset[:, None] * acc[-1]) * col_scale + bias."""
    _check_acc("int8_dequantize", acc, row_scale, row_offset, col_scale, bias)
    args = (acc, row_scale, row_offset, col_scale, bias, dtype)
    if backend is not None:
        return _impl(backend, acc).int8_dequantize(*args)
    return _int8_dequantize(*args)


def _fake_bias_gelu(acc, row_scale, row_offset, col_scale, bias, approximate):
    return _fake_rows(acc)


@fused_op("int8_bias_gelu", _fake_bias_gelu)
def _int8_bias_gelu(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Tensor,
                    approximate: str) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(_impl(None, acc).int8_bias_gelu(acc, row_scale, row_offset, col_scale, bias, approximate))


def int8_bias_gelu(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Tensor,
                   approximate: str = "none", *, backend: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """quantize_rows(gelu(int8_dequantize(acc, ...))): the FFN's first GEMM's output, activated and
    quantized for the second, with no float activation in memory."""
    _check_acc("int8_bias_gelu", acc, row_scale, row_offset, col_scale, bias)
    check_approximate("int8_bias_gelu", approximate)
    args = (acc, row_scale, row_offset, col_scale, bias, approximate)
    if backend is not None:
        return tuple(_impl(backend, acc).int8_bias_gelu(*args))
    return _int8_bias_gelu(*args)


def _fake_glu(acc, row_scale, row_offset, col_scale, bias, gate):
    rows, n = acc.shape[0] - 1, acc.shape[1] // 2
    return _fake_quantize(acc.new_empty((rows, n), dtype=torch.float32))


@fused_op("int8_glu", _fake_glu)
def _int8_glu(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Optional[Tensor],
              gate: str) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(_impl(None, acc).int8_glu(acc, row_scale, row_offset, col_scale, bias, gate))


GATES = ("none", "tanh", "silu")


def int8_glu(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Optional[Tensor] = None,
             gate: str = "none", *, backend: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """quantize_rows(act(a) * b) of the dequantized accumulator [a, b] = int8_dequantize(acc, ...)
    [rows, 2n]: a gated feed-forward's joined gate and up products, activated (act: GELU's "none" or
    "tanh", GeGLU; "silu", SwiGLU) and quantized for its output product, in fp32 and with no float
    activation in memory. -> (q [rows + 1, n], scale [rows], offset [rows])."""
    _check_acc("int8_glu", acc, row_scale, row_offset, col_scale, bias)
    if acc.shape[1] % 2:
        raise ValueError(f"{where_of('int8_glu')}: acc must hold the gate's and the up product's columns (an even "
                         f"number), got {acc.shape[1]}")
    if gate not in GATES:
        raise ValueError(f"{where_of('int8_glu')}: gate must be one of {', '.join(GATES)}, got {gate!r}")
    args = (acc, row_scale, row_offset, col_scale, bias, gate)
    if backend is not None:
        return tuple(_impl(backend, acc).int8_glu(*args))
    return _int8_glu(*args)


def _fake_norm_outputs(residual, quantize):
    """The int8 add + LayerNorm ops' outputs (y, q, scale, offset): q, scale, offset empty unless quantize."""
    if quantize:
        return (torch.empty_like(residual), *_fake_quantize(residual))
    empty = residual.new_empty(0, dtype=torch.float32)
    return torch.empty_like(residual), residual.new_empty(0, dtype=torch.int8), empty, torch.empty_like(empty)


def _fake_add_layer_norm(acc, row_scale, row_offset, col_scale, bias, residual, weight, ln_bias, eps, quantize):
    return _fake_norm_outputs(residual, quantize)


@fused_op("int8_add_layer_norm", _fake_add_layer_norm)
def _int8_add_layer_norm(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Tensor,
                         residual: Tensor, weight: Tensor, ln_bias: Tensor, eps: float,
                         quantize: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(_impl(None, acc).int8_add_layer_norm(acc, row_scale, row_offset, col_scale, bias, residual, weight,
                                                      ln_bias, eps, quantize))


def _fake_add_layer_norm_sum(*args):
    return (*_fake_add_layer_norm(*args), torch.empty_like(args[5]))


@fused_op("int8_add_layer_norm_sum", _fake_add_layer_norm_sum)
def _int8_add_layer_norm_sum(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Tensor,
                             residual: Tensor, weight: Tensor, ln_bias: Tensor, eps: float,
                             quantize: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # _int8_add_layer_norm's outputs, then the sum (residual's dtype)
    return tuple(_impl(None, acc).int8_add_layer_norm(acc, row_scale, row_offset, col_scale, bias, residual, weight,
                                                      ln_bias, eps, quantize, return_sum=True))


def int8_add_layer_norm(acc: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor, bias: Tensor,
                        residual: Tensor, weight: Tensor, ln_bias: Tensor, eps: float = 1e-12, *,
                        quantize: bool = True, return_sum: bool = False,
                        backend: Optional[str] = None) -> Tuple[Tensor, ...]:
    """(y, q, scale, offset): y = layer_norm(h) * weight + ln_bias in residual's dtype, h =
    int8_dequantize(acc, ...) + residual in fp32, statistics in fp32; (q, scale, offset) = y quantized
    per row for the next GEMM when `quantize` (else empty tensors). return_sum: (y, q, scale, offset,
    h), h in residual's dtype (a pre-LN encoder's residual stream), from the same pass over acc."""
    _check_acc("int8_add_layer_norm", acc, row_scale, row_offset, col_scale, bias)
    check_float("int8_add_layer_norm", "residual", residual)
    if tuple(residual.shape) != (acc.shape[0] - 1, acc.shape[1]):
        raise ValueError(f"fastbert.ops.int8_add_layer_norm: residual has shape {tuple(residual.shape)} but acc holds "
                         f"{acc.shape[0] - 1} rows of {acc.shape[1]}")
    args = (acc, row_scale, row_offset, col_scale, bias, residual.contiguous(), weight, ln_bias, float(eps),
            bool(quantize))
    if backend is not None:
        return tuple(_impl(backend, acc).int8_add_layer_norm(*args, return_sum=bool(return_sum)))
    return _int8_add_layer_norm_sum(*args) if return_sum else _int8_add_layer_norm(*args)


# --------------------------------------------------------------------------------------------
# The same epilogues on the product of quantized rows a [rows + 1, k] with a packed weight, which the
# extension makes a chunk of rows at a time into an accumulator the epilogue reads while it is in
# cache (csrc/int8.cpp, int8_packed_*): the bits of int8_matmul then the op.

def _packed_rows_like(a: Tensor, weight: Tensor, n: Optional[int] = None) -> Tensor:
    return a.new_empty((a.shape[0] - 1, n or int8_out_features(weight)), dtype=torch.float32)


def _fake_packed_dequantize(a, weight, row_scale, row_offset, col_scale, bias, dtype):
    return _packed_rows_like(a, weight).to(dtype)


@fused_op("int8_packed_dequantize", _fake_packed_dequantize)
def _int8_packed_dequantize(a: Tensor, weight: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor,
                            bias: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    return fb_backend.cpp_function("int8_packed_dequantize")(a, weight, row_scale, row_offset, col_scale, bias, dtype)


def _fake_packed_bias_gelu(a, weight, row_scale, row_offset, col_scale, bias, approximate):
    return _fake_quantize(_packed_rows_like(a, weight))


@fused_op("int8_packed_bias_gelu", _fake_packed_bias_gelu)
def _int8_packed_bias_gelu(a: Tensor, weight: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor,
                           bias: Tensor, approximate: str) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(fb_backend.cpp_function("int8_packed_bias_gelu")(a, weight, row_scale, row_offset, col_scale, bias,
                                                                  approximate))


def _fake_packed_glu(a, weight, row_scale, row_offset, col_scale, bias, gate):
    return _fake_quantize(_packed_rows_like(a, weight, int8_out_features(weight) // 2))


@fused_op("int8_packed_glu", _fake_packed_glu)
def _int8_packed_glu(a: Tensor, weight: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor,
                     bias: Optional[Tensor], gate: str) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(fb_backend.cpp_function("int8_packed_glu")(a, weight, row_scale, row_offset, col_scale, bias, gate))


def _fake_packed_add_layer_norm(a, weight, row_scale, row_offset, col_scale, bias, residual, ln_weight, ln_bias, eps,
                                quantize):
    return _fake_norm_outputs(residual, quantize)


@fused_op("int8_packed_add_layer_norm", _fake_packed_add_layer_norm)
def _int8_packed_add_layer_norm(a: Tensor, weight: Tensor, row_scale: Tensor, row_offset: Tensor, col_scale: Tensor,
                                bias: Tensor, residual: Tensor, ln_weight: Tensor, ln_bias: Tensor, eps: float,
                                quantize: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(fb_backend.cpp_function("int8_packed_add_layer_norm")(
        a, weight, row_scale, row_offset, col_scale, bias, residual, ln_weight, ln_bias, eps, quantize, False)[:4])


def _fake_packed_add_layer_norm_sum(*args):
    return (*_fake_packed_add_layer_norm(*args), torch.empty_like(args[6]))


@fused_op("int8_packed_add_layer_norm_sum", _fake_packed_add_layer_norm_sum)
def _int8_packed_add_layer_norm_sum(a: Tensor, weight: Tensor, row_scale: Tensor, row_offset: Tensor,
                                    col_scale: Tensor, bias: Tensor, residual: Tensor, ln_weight: Tensor,
                                    ln_bias: Tensor, eps: float, quantize: bool) -> Tuple[Tensor, Tensor, Tensor,
                                                                                          Tensor, Tensor]:
    return tuple(fb_backend.cpp_function("int8_packed_add_layer_norm")(
        a, weight, row_scale, row_offset, col_scale, bias, residual, ln_weight, ln_bias, eps, quantize, True))


PACKED_EPILOGUES = {"dequantize": _int8_packed_dequantize, "bias_gelu": _int8_packed_bias_gelu,
                    "glu": _int8_packed_glu, "add_layer_norm": _int8_packed_add_layer_norm,
                    "add_layer_norm_sum": _int8_packed_add_layer_norm_sum}


def packed_epilogue(name: str, a: Tensor, weight: Tensor):
    """The epilogue `name` (a key of PACKED_EPILOGUES: "dequantize", "bias_gelu", "glu",
    "add_layer_norm", "add_layer_norm_sum") on the product a @ weight^T itself, where the extension
    runs it: a packed weight, CPU rows on the cpp backend, not under torch.compile; else None (then
    int8_matmul, and the op on its accumulator). Arguments: (a, weight, then the accumulator op's
    own after acc)."""
    if (weight.dim() != 4 or a.device.type != "cpu" or a.dtype != torch.int8 or a.shape[0] <= 1
            or torch.compiler.is_compiling() or fb_backend.resolve(None, a) != "cpp"
            or fb_backend.cpp_function("int8_packed_dequantize") is None):
        return None
    return PACKED_EPILOGUES[name]
