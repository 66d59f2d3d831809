"""`fastbert selfcheck`: every op of fastbert.ops on every backend this machine can run, the C++
kernels at every instruction-set level this CPU executes ("cpp@avx2", "cpp@avx512", ...; see
fastbert.backend.cpu_capability), against the fp64 reference, forward and every gradient, with the
error bound the tests use:

    err(backend, fp64 reference) <= 2 * err(torch in the same dtype, fp64 reference) + ATOL[dtype] * scale

Ops whose result is exact (unpad / pad, token masking, the int8 GEMM and quantization) must match
their reference bit for bit; the int8 ops' float results are held to the same bound against fp64,
their int8 outputs dequantized.
"""
from __future__ import annotations

from typing import Callable, Iterator, List, Sequence, Tuple

import torch
import torch.nn.functional as F

import fastbert
from fastbert import backend as fb_backend
from fastbert import layouts, reference

ATOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
Row = Tuple[str, bool, float, float]  # (tensor name, ok, error, bound)

# ops with one implementation behind them (no backend argument) are checked once, as "auto"
SINGLE = ("unpad/pad", "linear", "attention_weights", "embedding", "int8_matmul", "quantize_weight", "pack_int8_weight",
          "unpack_int8_weight")
# int8: no Triton kernels (the CPU backends); "+sum": return_sum=True, which also returns the sum normalized
INT8_OPS = ("quantize_rows", "quantize_weight", "pack_int8_weight", "unpack_int8_weight", "int8_matmul",
            "int8_dequantize", "int8_bias_gelu", "int8_glu", "int8_add_layer_norm", "int8_add_layer_norm+sum")
ELEMENTWISE = ("bias_gelu", "geglu", "swiglu", "add_layer_norm", "add_layer_norm+sum", "add_rms_norm", "add_rms_norm+sum")


def bound_check(out: torch.Tensor, torch_out: torch.Tensor, ref64: torch.Tensor, dtype) -> Tuple[bool, float, float]:
    """(ok, err, bound) of the error bound above; non-finite output is never ok."""
    err = (out.detach().double() - ref64.detach()).abs().max().item() if out.numel() else 0.0
    base = (torch_out.detach().double() - ref64.detach()).abs().max().item() if out.numel() else 0.0
    scale = max(1.0, ref64.abs().max().item()) if out.numel() else 1.0
    bound = 2 * base + ATOL[dtype] * scale
    ok = bool(torch.isfinite(out).all()) and out.shape == ref64.shape and err <= bound
    return ok, err, bound


def exact_check(name: str, got: torch.Tensor, want: torch.Tensor) -> Row:
    """(name, ok, number of differing elements, 0): for results that must match exactly."""
    if got.shape != want.shape:
        return name, False, float(max(got.numel(), want.numel())), 0.0
    wrong = float((got != want).sum().item())
    return name, wrong == 0, wrong, 0.0


def with_grads(fn: Callable, inputs: Sequence[torch.Tensor], grad_out):
    """fn(*inputs) on fresh leaf copies -> (output, [gradient of each input]); for an fn with a tuple
    of outputs and grad_out a tuple of their gradients: (each output, ..., [gradient of each input])."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    outs, grads = (out, grad_out) if isinstance(out, tuple) else ((out,), (grad_out,))
    torch.autograd.backward(outs, [g.to(o.dtype) for o, g in zip(outs, grads)])
    return [o.detach() for o in outs] + [t.grad for t in leaves]


def compare(names: Sequence[str], fused: Callable, ref: Callable, inputs, grad_out, dtype) -> List[Row]:
    """fused vs ref (same dtype) vs ref in fp64, the output(s) and the gradient of every input."""
    got = with_grads(fused, inputs, grad_out)
    base = with_grads(ref, inputs, grad_out)
    r64 = with_grads(ref, [t.double() for t in inputs],
                     tuple(g.double() for g in grad_out) if isinstance(grad_out, tuple) else grad_out.double())
    return [(name, *bound_check(a, b, c, dtype)) for name, a, b, c in zip(names, got, base, r64)]


def available_backends(device: str) -> List[str]:
    names = ["torch"]
    if device == "cpu" and fb_backend.cpp_available():
        names.append("cpp")
    if fb_backend.triton_available() and (device == "cuda" or fb_backend.triton_interpreting()):
        names.append("triton")
    return names


def op_backends(op: str, device: str) -> List[str]:
    """The backends `op` runs on here: "auto" for single-implementation ops, no triton for masking."""
    if op in SINGLE:
        return ["auto"]
    names = available_backends(device)
    # masking and int8 have no Triton kernels
    no_triton = op == "mask_tokens" or op in INT8_OPS
    return [b for b in names if b != "triton"] if no_triton else names


def cases(device: str, interpreted: bool) -> Iterator[Tuple[str, tuple, torch.dtype]]:
    """(op, shape, dtype) for every check; small shapes when Triton runs under the interpreter.
    Shapes: [rows, hidden] for the elementwise ops (geglu, swiglu: [rows, 2 hidden] in),
    [batch, heads, seq, head_dim] for attention, [batch, seq, hidden] for unpad/pad, [batch, seq] for
    masking, [rows, in, out] for linear, [tokens, vocab, hidden] for embedding."""
    rows = [(3, 7), (4, 768)] if interpreted else [(512, 768), (512, 3072), (333, 1023)]
    dtypes = [torch.float32, torch.float16] if interpreted else [torch.float32, torch.bfloat16]
    attn = [(3, 2, 17, 16)] if interpreted else [(4, 4, 97, 64)]
    for op in ELEMENTWISE:
        for shape in rows:
            for dtype in dtypes:
                yield op, shape, dtype
    for op in ("attention", "varlen_attention"):
        for shape in attn:
            for dtype in dtypes:
                yield op, shape, dtype
    # what the newer encoders add to attention: rotary and a local window (ModernBERT), a relative
    # position bias (MPNet)
    modern = [(3, 2, 17, 32)] if interpreted else [(4, 4, 97, 64)]
    for op in ("rotary", "rotary+window", "relative_bias"):
        for shape in modern:
            for dtype in dtypes:
                yield op, shape, dtype
    # DeBERTa's disentangled attention: 16 log buckets, so 97 tokens reach past the linear ones
    for op in ("disentangled_attention", "varlen_disentangled_attention"):
        for shape in modern:
            for dtype in dtypes:
                yield op, shape, dtype
    for dtype in dtypes:
        yield "attention_weights", attn[0], dtype
    yield "unpad/pad", (5, 33, 24), torch.float32
    yield "mask_tokens", (16, 128), torch.int64
    for dtype in (torch.float32, torch.bfloat16):
        yield "linear", (1500, 512, 768), dtype  # a 4.6 MiB fp32 output: the reusing allocator serves it
        yield "embedding", (700, 3000, 512), dtype  # a 5.9 MiB fp32 weight gradient: from the reusing allocator
    yield "linear", (20, 768, 2304), torch.float32  # a batch of one short query's QKV projection
    for op in INT8_OPS:
        for shape in ((3, 7, 5), (200, 384, 1536)):  # [rows, in, out] of one int8 linear layer
            yield op, shape, torch.float32
    for dtype in dtypes:  # one post-LN encoder layer in one call: [batch, seq, hidden, heads]
        yield "encoder_layer", (3, 9, 32, 2) if interpreted else (4, 97, 256, 4), dtype


def _mixed_mask(batch: int, seq: int, g: torch.Generator) -> torch.Tensor:
    """Rows: full, empty, then random lengths; odd rows left-padded."""
    lengths = [seq, 0] + torch.randint(1, seq + 1, (batch - 2,), generator=g).tolist()
    mask = torch.zeros(batch, seq, dtype=torch.int64)
    for b, n in enumerate(lengths):
        if b % 2:
            mask[b, seq - n:] = 1
        else:
            mask[b, :n] = 1
    return mask


def _elementwise(op, shape, dtype, backend, device, g) -> List[Row]:
    m, n = shape
    if op in ("geglu", "swiglu"):  # x [m, 2n] -> [m, n]
        x, dy = (torch.randn(m, k, generator=g).to(device, dtype) for k in (2 * n, n))
        fused = lambda x_: getattr(fastbert.ops, op)(x_, backend=backend)  # noqa: E731
        return compare(["y", "dx"], fused, getattr(reference, op), [x], dy, dtype)
    x = torch.randn(m, n, generator=g).to(device, dtype)
    dy = torch.randn(m, n, generator=g).to(device, dtype)
    if op == "bias_gelu":
        inputs = [x, torch.randn(n, generator=g).to(device, dtype)]
        fused = lambda *a: fastbert.ops.bias_gelu(*a, backend=backend)  # noqa: E731
        return compare(["y", "dx", "dbias"], fused, reference.bias_gelu, inputs, dy, dtype)
    inputs = [x, torch.randn(m, n, generator=g).to(device, dtype),
              (1 + torch.randn(n, generator=g)).to(device, dtype), torch.randn(n, generator=g).to(device, dtype)]
    p, seed, sum_form = 0.1, 1234, op.endswith("+sum")
    keep = reference.dropout_keep_mask(seed, shape, p, device)
    outs = ["y", "s"] if sum_form else ["y"]  # the sum form: the gradients of both flow back
    grad = (dy, torch.randn(m, n, generator=g).to(device, dtype)) if sum_form else dy
    if op.startswith("add_rms_norm"):  # the RMSNorm form: add_layer_norm's kernels, no mean, no bias (EuroBERT's)
        return compare([*outs, "dx", "dresidual", "dweight"],
                       lambda *a: fastbert.ops.add_rms_norm(*a, dropout_p=p, seed=seed, return_sum=sum_form,
                                                            backend=backend),
                       lambda *a: reference.add_rms_norm(*a, dropout_p=p, keep_mask=keep, return_sum=sum_form),
                       inputs[:3], grad, dtype)
    fused = lambda *a: fastbert.ops.add_layer_norm(*a, dropout_p=p, seed=seed, return_sum=sum_form,  # noqa: E731
                                                   backend=backend)
    ref = lambda *a: reference.add_layer_norm(*a, dropout_p=p, keep_mask=keep, return_sum=sum_form)  # noqa: E731
    rows = compare([*outs, "dx", "dresidual", "dweight", "dbias"], fused, ref, inputs, grad, dtype)
    # a LayerNorm without bias (bias=None), as ModernBERT's
    no_bias = compare([*outs, "dx", "dresidual", "dweight"], lambda *a: fused(*a, None), lambda *a: ref(*a, None),
                      inputs[:3], grad, dtype)
    return rows + [(f"{name} (no bias)", *rest) for name, *rest in no_bias]


ATTENTION_DROPOUT, ATTENTION_SEED = 0.1, 4321


def _attention_inputs(shape, dtype, device, g):
    """(mask, [q, k, v], dout, the reference's keep-mask, the real query rows) of an attention check."""
    batch, heads, seq, d = shape
    mask = _mixed_mask(batch, seq, g).to(device)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, generator=g).to(device, dtype) for _ in range(4))
    keep = reference.attention_keep_mask(ATTENTION_SEED, batch, heads, seq, seq, ATTENTION_DROPOUT,
                                         reference.mask_starts(mask), device)
    return mask, [q, k, v], dout, keep, mask.bool()[:, None, :, None]


def _attention(op, shape, dtype, backend, device, g) -> List[Row]:
    batch, heads, seq, d = shape
    mask, (q, k, v), dout, keep, real = _attention_inputs(shape, dtype, device, g)
    p, seed = ATTENTION_DROPOUT, ATTENTION_SEED
    ref = lambda q_, k_, v_: reference.attention(q_, k_, v_, mask, p, keep_mask=keep)  # noqa: E731
    if op == "attention":
        fused = lambda q_, k_, v_: fastbert.ops.attention(  # noqa: E731
            q_, k_, v_, mask, dropout_p=p, seed=seed, backend=backend)
    else:
        _, indices, cu_seqlens, max_seqlen = fastbert.ops.unpad(q.transpose(1, 2), mask)

        def fused(q_, k_, v_):
            packed = [fastbert.ops.unpad(t.transpose(1, 2), mask)[0] for t in (q_, k_, v_)]
            out = fastbert.ops.varlen_attention(*packed, cu_seqlens, max_seqlen, dropout_p=p, seed=seed,
                                                backend=backend)
            return fastbert.ops.pad(out, indices, batch, seq).transpose(1, 2)
    return compare(["out", "dq", "dk", "dv"], lambda *a: fused(*a) * real, lambda *a: ref(*a) * real,
                   [q, k, v], dout, dtype)


def _attention_extras(op, shape, dtype, backend, device, g) -> List[Row]:
    """Attention with rotary embeddings (ModernBERT's global layers), with a window of 8 too (its
    local layers), or with a relative position bias (MPNet's, its gradient checked too), dropout on,
    against the reference."""
    batch, heads, seq, d = shape
    mask, (q, k, v), dout, keep, real = _attention_inputs(shape, dtype, device, g)
    p = ATTENTION_DROPOUT
    kw = dict(dropout_p=p, seed=ATTENTION_SEED, backend=backend)
    if op in ("rotary", "rotary+window"):
        cos, sin = reference.rotary_tables(10000.0, d, seq, device)
        window = 8 if op == "rotary+window" else None

        def ref(q_, k_, v_):
            q_, k_ = reference.rotate(q_, cos, sin), reference.rotate(k_, cos, sin)
            return reference.attention(q_, k_, v_, mask, p, keep_mask=keep, window=window) * real

        def fused(q_, k_, v_):
            return fastbert.ops.attention(q_, k_, v_, mask, rotary_base=10000.0, window=window, **kw) * real

        return compare(["out", "dq", "dk", "dv"], fused, ref, [q, k, v], dout, dtype)
    rel = layouts.relative_bias(torch.randn(32, heads, generator=g), seq).to(device, dtype)

    def ref_rel(q_, k_, v_, r_):
        return reference.attention(q_, k_, v_, mask, p, keep_mask=keep, bias=layouts.relative_bias_matrix(r_, seq)) * real

    def fused_rel(q_, k_, v_, r_):
        return fastbert.ops.attention(q_, k_, v_, mask, relative_bias=r_, **kw) * real

    return compare(["out", "dq", "dk", "dv", "drelative"], fused_rel, ref_rel, [q, k, v, rel], dout, dtype)


DEBERTA_BUCKETS, DEBERTA_FURTHEST = 16, 64


def _disentangled(op, shape, dtype, backend, device, g) -> List[Row]:
    """DeBERTa's disentangled attention, both position terms (their tables' gradients checked too),
    dropout on, padded or packed, against the reference formulation."""
    batch, heads, seq, d = shape
    mask, (q, k, v), dout, keep, real = _attention_inputs(shape, dtype, device, g)
    pk, pq = (torch.randn(heads, 2 * DEBERTA_BUCKETS, d, generator=g).to(device, dtype) for _ in range(2))
    kw = dict(position_buckets=DEBERTA_BUCKETS, max_relative_positions=DEBERTA_FURTHEST,
              dropout_p=ATTENTION_DROPOUT)

    def ref(q_, k_, v_, pk_, pq_):
        return reference.disentangled_attention(q_, k_, v_, mask, pk_, pq_, keep_mask=keep, **kw)[0] * real

    def fused(q_, k_, v_, pk_, pq_):
        tables = dict(pos_key=pk_, pos_query=pq_, seed=ATTENTION_SEED, backend=backend, **kw)
        if op == "disentangled_attention":
            return fastbert.ops.disentangled_attention(q_, k_, v_, mask, **tables) * real
        packed, indices, cu_seqlens, max_seqlen = zip(*(fastbert.ops.unpad(t.transpose(1, 2), mask) for t in (q_, k_, v_)))
        out = fastbert.ops.varlen_disentangled_attention(*packed, cu_seqlens[0], max_seqlen[0], **tables)
        return fastbert.ops.pad(out, indices[0], batch, seq).transpose(1, 2)

    return compare(["out", "dq", "dk", "dv", "dpos_key", "dpos_query"], fused, ref, [q, k, v, pk, pq], dout, dtype)


def _attention_weights(shape, dtype, device, g) -> List[Row]:
    """The explicit path (probabilities returned) against the reference, at real query rows."""
    batch, heads, seq, d = shape
    mask = _mixed_mask(batch, seq, g).to(device)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, generator=g).to(device, dtype) for _ in range(4))
    bias = torch.zeros(mask.shape, device=device).masked_fill(mask == 0, float("-inf"))[:, None, None, :]
    real = mask.bool()[:, None, :, None]
    ours = lambda q_, k_, v_: fastbert.ops.attention_weights(q_, k_, v_, bias)[0] * real  # noqa: E731
    ref = lambda q_, k_, v_: reference.attention(q_, k_, v_, mask) * real  # noqa: E731
    rows = compare(["out", "dq", "dk", "dv"], ours, ref, [q, k, v], dout, dtype)
    with torch.no_grad():
        probs = fastbert.ops.attention_weights(q.float(), k.float(), v.float(), bias)[1].double()
    sums = probs.sum(-1)[real[..., 0].expand(-1, heads, -1)]
    return rows + [("probs sum to 1", *bound_check(sums, sums, torch.ones_like(sums), torch.float32))]


def _unpad_pad(shape, device, g) -> List[Row]:
    batch, seq, hidden = shape
    mask = _mixed_mask(batch, seq, g).to(device)
    x = torch.randn(batch, seq, hidden, generator=g).to(device)
    packed, indices, cu_seqlens, max_seqlen = fastbert.ops.unpad(x, mask)
    lengths = mask.sum(1)
    want_cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    back = fastbert.ops.pad(packed, indices, batch, seq)
    return [
        exact_check("packed", packed, x[mask.bool()]),
        exact_check("cu_seqlens", cu_seqlens, want_cu),
        ("max_seqlen", max_seqlen == int(lengths.max()), float(abs(max_seqlen - int(lengths.max()))), 0.0),
        exact_check("pad", back, x * mask[..., None]),
    ]


def _mask_tokens(shape, backend, g) -> List[Row]:
    batch, seq = shape
    vocab, mask_id = 1000, 4
    ids = torch.randint(5, vocab, shape, generator=g)
    attention_mask = _mixed_mask(batch, seq, g)
    ids[:, 0] = 2
    word_start = torch.rand(shape, generator=g) > 0.3
    kw = dict(mask_token_id=mask_id, vocab_size=vocab, attention_mask=attention_mask, seed=99,
              special_token_ids=[0, 1, 2, 3, 4])
    rows = []
    for tag, extra in (("", {}), ("wwm ", {"word_start_mask": word_start})):
        got = fastbert.masking.mask_tokens(ids, backend=backend, **kw, **extra)
        want = reference.mask_tokens(ids, **kw, **extra)
        rows += [exact_check(tag + "input_ids", got[0], want[0]), exact_check(tag + "labels", got[1], want[1])]
    return rows


def _linear(shape, dtype, device, g) -> List[Row]:
    from fastbert.ops import gemm

    m, k, n = shape
    x, dy = torch.randn(m, k, generator=g).to(device, dtype), torch.randn(m, n, generator=g).to(device, dtype)
    w, b = torch.randn(n, k, generator=g).to(device, dtype) / k**0.5, torch.randn(n, generator=g).to(device, dtype)
    with torch.no_grad():  # the inference path
        infer = fastbert.ops.linear(x, w, b)
        base, r64 = F.linear(x, w, b), F.linear(x.double(), w.double(), b.double())
    rows = [("y (inference)", *bound_check(infer, base, r64, dtype))]
    if x.device.type == "cpu" and dtype == torch.float32 and "dot" in gemm.candidates("fwd", dtype):
        with torch.no_grad(), gemm.forced("dot"):  # fastbert's own fp32 GEMM, whether or not it was chosen
            rows.append(("y (dot GEMM)", *bound_check(fastbert.ops.linear(x, w, b), base, r64, dtype)))
    return rows + compare(["y", "dx", "dweight", "dbias"], fastbert.ops.linear, F.linear, [x, w, b], dy, dtype)


def _embedding(shape, dtype, device, g) -> List[Row]:
    tokens, vocab, hidden = shape
    ids = torch.randint(0, vocab // 20, (tokens,), generator=g).to(device)  # ids repeat: their rows sum
    ids[::7] = 0  # the padding row, whose gradient stays zero
    w, dy = torch.randn(vocab, hidden, generator=g).to(device, dtype), torch.randn(tokens, hidden, generator=g)

    def fused(w_):
        return fastbert.ops.embedding(ids, w_, 0)

    def ref(w_):
        return F.embedding(ids, w_, 0)

    return compare(["y", "dweight"], fused, ref, [w], dy.to(device, dtype), dtype)


def _dequantized(q, s, o) -> torch.Tensor:
    return q[:-1].double() * s.double()[:, None] + o.double()[:, None]


def _int8(op, shape, backend, device, g) -> List[Row]:
    """One int8 linear layer [rows, in] x [out, in] and what reads its output, against the rules of
    fastbert.reference.int8 (exact where they are exact) and fp64 (dequantized)."""
    from fastbert.reference import int8 as ref

    m, k, n = shape
    x = (torch.randn(m, k, generator=g) + torch.randn(k, generator=g)).to(device)
    w, b = (torch.randn(n, k, generator=g) / k**0.5).to(device), torch.randn(n, generator=g).to(device)
    kw = {} if backend == "auto" else {"backend": backend}
    if op == "quantize_rows":
        got, want = fastbert.ops.quantize_rows(x, **kw), ref.quantize_rows(x)
        return [exact_check(name, a, c) for name, a, c in zip(("q", "scale", "offset"), got, want)]
    wq, ws = layouts.quantize_weight(w)
    if op == "quantize_weight":
        return [exact_check(name, a, c) for name, a, c in zip(("q", "scale"), fastbert.ops.quantize_weight(w), (wq, ws))]
    xq, xs, xo = ref.quantize_rows(x)
    if op in ("pack_int8_weight", "unpack_int8_weight"):  # a weight of whole 16-feature panels, packed
        w16 = torch.randint(-128, 128, (-(-n // 16) * 16, k), generator=g, dtype=torch.int8).to(device)
        if op == "unpack_int8_weight":
            return [exact_check("w", fastbert.ops.unpack_int8_weight(fastbert.ops.pack_int8_weight(w16), k), w16)]
        lo, w64 = torch.full_like(xq, -128), torch.randint(-64, 65, w16.shape, generator=g, dtype=torch.int8).to(device)
        return [exact_check(name, fastbert.ops.int8_matmul(a, fastbert.ops.pack_int8_weight(b)).double(),
                            a.double() @ b.double().t())
                for name, a, b in (("acc (packed)", xq, w16), ("acc -128 x -128 (packed)", lo, torch.full_like(w16, -128)),
                                   ("acc x [-64, 64] (packed)", xq, w64))]  # [-64, 64]: AVX2's u8 x s8 scheme
    acc = ref.int8_mm(xq, wq)
    if op == "int8_matmul":
        return _int8_matmul(xq, wq, g)
    y64 = (acc.double()[:-1] * xs.double()[:, None] + xo.double()[:, None] * acc.double()[-1]) * ws.double() + b.double()
    base = ref.dequantize(acc, xs, xo, ws, b)
    if op == "int8_dequantize":
        return [("y", *bound_check(fastbert.ops.int8_dequantize(acc, xs, xo, ws, b, **kw), base, y64, torch.float32))]
    if op == "int8_bias_gelu":
        want = F.gelu(y64)
        got, theirs = fastbert.ops.int8_bias_gelu(acc, xs, xo, ws, b, **kw), ref.int8_bias_gelu(acc, xs, xo, ws, b)
        return [("gelu (dequantized)", *bound_check(_dequantized(*got), _dequantized(*theirs), want, torch.float32))]
    if op == "int8_glu":  # the layer's outputs as a gated unit's [gate, up] (an even number of them), each gate
        cols = n - n % 2
        a64, u64 = y64[:, :cols].chunk(2, dim=-1)
        args = (acc[:, :cols].contiguous(), xs, xo, ws[:cols].contiguous(), b[:cols].contiguous())
        acts = {"none": F.gelu, "tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}
        return [(f"{gate} (dequantized)", *bound_check(_dequantized(*fastbert.ops.int8_glu(*args, gate, **kw)),
                                                       _dequantized(*ref.int8_glu(*args, gate)), act(a64) * u64,
                                                       torch.float32))
                for gate, act in acts.items()]
    residual = torch.randn(m, n, generator=g).to(device)
    lw, lb = (1 + 0.1 * torch.randn(n, generator=g)).to(device), torch.randn(n, generator=g).to(device)
    want = F.layer_norm(y64 + residual.double(), (n,), lw.double(), lb.double(), 1e-12)
    sum_form = op == "int8_add_layer_norm+sum"  # also the sum the norm is taken of, fifth
    y, *q = fastbert.ops.int8_add_layer_norm(acc, xs, xo, ws, b, residual, lw, lb, 1e-12, return_sum=sum_form, **kw)
    ty, *tq = ref.int8_add_layer_norm(acc, xs, xo, ws, b, residual, lw, lb, 1e-12, True, sum_form)
    rows = [("y", *bound_check(y, ty, want, torch.float32)),
            ("y (dequantized)", *bound_check(_dequantized(*q[:3]), _dequantized(*tq[:3]), want, torch.float32))]
    return rows + ([("s", *bound_check(q[3], tq[3], y64 + residual.double(), torch.float32))] if sum_form else [])


def _int8_matmul(xq, wq, g) -> List[Row]:
    """The int8 GEMM on its measured path and on fastbert's own kernel, also on the extreme values
    that would saturate a 16-bit product (-128 * -128 pairs) and on weights in [-64, 64] (AVX2's
    u8 x s8 kernel) at their extremes, exact."""
    from fastbert.ops import gemm

    def want(a, b):
        return a.double() @ b.double().t()  # exact: |sums| < 2^53 (and int64 products are CPU-only)

    rows = [exact_check("acc", fastbert.ops.int8_matmul(xq, wq).double(), want(xq, wq))]
    if "fastbert" not in gemm.candidates("fwd", torch.int8):
        return rows
    lo, w_lo = torch.full_like(xq, -128), torch.full_like(wq, -128)
    w_mixed = (torch.randint(0, 2, wq.shape, generator=g) * 255 - 128).to(torch.int8)  # -128 or 127
    with gemm.forced("fastbert"):
        cases = (("acc (fastbert)", xq, wq), ("acc -128 x -128", lo, w_lo), ("acc -128 x +-", lo, w_mixed),
                 ("acc 127 x 64", torch.full_like(xq, 127), torch.full_like(wq, 64)),
                 ("acc x [-64, 64]", xq, layouts.quantize_weight(wq.float(), 64)[0]))
        for name, a, b in cases:
            rows.append(exact_check(name, fastbert.ops.int8_matmul(a, b).double(), want(a, b)))
    return rows


def check_case(op: str, shape, dtype, backend: str, device: str) -> List[Row]:
    """The rows (tensor, ok, err, bound) of one op on one backend, on fresh seeded inputs."""
    g = torch.Generator().manual_seed(0)
    if op in ELEMENTWISE:
        return _elementwise(op, shape, dtype, backend, device, g)
    if op in ("attention", "varlen_attention"):
        return _attention(op, shape, dtype, backend, device, g)
    if op in ("rotary", "rotary+window", "relative_bias"):
        return _attention_extras(op, shape, dtype, backend, device, g)
    if op in ("disentangled_attention", "varlen_disentangled_attention"):
        return _disentangled(op, shape, dtype, backend, device, g)
    if op == "attention_weights":
        return _attention_weights(shape, dtype, device, g)
    if op == "unpad/pad":
        return _unpad_pad(shape, device, g)
    if op == "mask_tokens":
        return _mask_tokens(shape, backend, g)
    if op == "linear":
        return _linear(shape, dtype, device, g)
    if op == "embedding":
        return _embedding(shape, dtype, device, g)
    if op in INT8_OPS:
        return _int8(op, shape, backend, device, g)
    if op == "encoder_layer":
        return _encoder_layer(shape, dtype, backend, device, _mixed_mask(shape[0], shape[1], g), g)
    raise ValueError(f"fastbert selfcheck: unknown op {op!r}")


def _layer_weights(hidden: int, ffn: int, g: torch.Generator):
    def t(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    return fastbert.ops.LayerWeights(
        t(3 * hidden, hidden, scale=hidden ** -0.5), t(3 * hidden), t(hidden, hidden, scale=hidden ** -0.5), t(hidden),
        1 + 0.1 * t(hidden), t(hidden), t(ffn, hidden, scale=hidden ** -0.5), t(ffn), t(hidden, ffn, scale=ffn ** -0.5),
        t(hidden), 1 + 0.1 * t(hidden), t(hidden))


def _written_out(x, w, mask, heads: int, eps: float):
    """The layer in plain torch (any dtype): softmax attention over the real keys, add + LayerNorm,
    erf GELU feed-forward, add + LayerNorm."""
    batch, seq, hidden = x.shape
    d = hidden // heads
    q, k, v = F.linear(x, w.qkv_weight, w.qkv_bias).view(batch, seq, 3, heads, d).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-1, -2)) / d ** 0.5
    scores = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
    ctx = torch.nan_to_num(scores.softmax(-1)) @ v
    ctx = ctx.transpose(1, 2).reshape(batch, seq, hidden)
    h1 = F.layer_norm(F.linear(ctx, w.out_weight, w.out_bias) + x, (hidden,), w.norm1_weight, w.norm1_bias, eps)
    inter = F.gelu(F.linear(h1, w.ffn_in_weight, w.ffn_in_bias))
    return F.layer_norm(F.linear(inter, w.ffn_out_weight, w.ffn_out_bias) + h1, (hidden,), w.norm2_weight,
                        w.norm2_bias, eps)


def _encoder_layer(shape, dtype, backend: str, device: str, mask: torch.Tensor, g: torch.Generator) -> List[Row]:
    """fastbert.ops.encoder_layer: one post-LN encoder layer (padded with a mixed padding mask, and
    packed) against the same layer written out in plain torch in fp64, at the real tokens, with the
    bound of every other op. shape: [batch, seq, hidden, heads]; mask [batch, seq] (some rows empty
    or left-padded)."""
    batch, seq, hidden, heads = shape
    w64 = fastbert.ops.LayerWeights(*(t.double() for t in _layer_weights(hidden, 2 * hidden, g)))
    x64 = torch.randn(batch, seq, hidden, generator=g, dtype=torch.float64)
    w = fastbert.ops.LayerWeights(*(t.to(device, dtype) for t in w64))
    x, mask = x64.to(device, dtype), mask.to(device)
    real = mask.bool()
    ref64 = _written_out(x64.to(device), fastbert.ops.LayerWeights(*(t.to(device) for t in w64)), mask, heads, 1e-12)
    rows = []
    with torch.no_grad():
        base = _written_out(x, w, mask, heads, 1e-12)
        out = fastbert.ops.encoder_layer(x, w, heads=heads, eps=(1e-12, 1e-12), attention_mask=mask, backend=backend)
        rows.append(("y (padded)", *bound_check(out[real], base[real], ref64[real], dtype)))
        lengths = real.sum(1)
        cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
        packed = fastbert.ops.encoder_layer(x[real], w, heads=heads, eps=(1e-12, 1e-12), cu_seqlens=cu,
                                            max_seqlen=int(lengths.max()), backend=backend)
        # the layer has no positions of its own: a sequence's real tokens packed give what they gave padded
        rows.append(("y (packed)", *bound_check(packed, base[real], ref64[real], dtype)))
    return rows
