"""The Triton launchers' inference options (fastbert.ops.encoder's route on CUDA): an output written
over an input that dies with the call, and the statistics only a backward reads left unkept. Each
must give the same bits as the plain call, which the op tests compare with the reference; and a
plain call after them must find its statistics as before (the sink they write is nobody's)."""
import math
import os

import pytest
import torch

from fastbert import backend as fb_backend
from tests.helpers.backends import device_for, require

pytestmark = pytest.mark.triton


@pytest.fixture(autouse=True)
def _triton():
    require("triton")


def kernels(name):
    return fb_backend.impl("triton", name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_sum", [False, True])
def test_add_layer_norm_over_its_inputs(dtype, with_sum):
    dev = device_for("triton")
    g = torch.Generator().manual_seed(0)
    x, res = (torch.randn(37, 96, generator=g).to(dev, dtype) for _ in range(2))
    w, b = 1 + torch.randn(96, generator=g).to(dev), torch.randn(96, generator=g).to(dev)
    ln = kernels("layer_norm")
    want = ln.add_layer_norm_forward(x, res, w, b, 1e-5, 0.0, None, with_sum)
    xi, ri = x.clone(), res.clone()
    got = ln.add_layer_norm_forward(xi, ri, w, b, 1e-5, 0.0, None, with_sum, out=xi, sum_out=ri if with_sum else None,
                                    stats=False)
    assert got[0].data_ptr() == xi.data_ptr() and torch.equal(got[0], want[0])
    assert got[1] is None and got[2] is None
    if with_sum:
        assert got[3].data_ptr() == ri.data_ptr() and torch.equal(got[3], want[3])
    again = ln.add_layer_norm_forward(x, res, w, b, 1e-5, 0.0, None, with_sum)
    assert all(torch.equal(a, c) for a, c in zip(again, want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bias_gelu_over_its_input(dtype):
    dev = device_for("triton")
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(19, 200, generator=g) * 2).to(dev, dtype)
    b = torch.randn(200, generator=g).to(dev, dtype)
    for approximate in ("none", "tanh"):
        want = kernels("bias_gelu").bias_gelu_forward(x, b, approximate)
        xi = x.clone()
        got = kernels("bias_gelu").bias_gelu_forward(xi, b, approximate, out=xi)
        assert got.data_ptr() == xi.data_ptr() and torch.equal(got, want), approximate


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", ["layer", "layer without bias", "rms"])
@pytest.mark.parametrize("with_sum", [False, True])
def test_bound_add_layer_norm_gives_the_launchers_bits(dtype, norm, with_sum):
    # add_layer_norm_inference (its launch bound once per N and flags) against the launcher's plain
    # call, at sizes whose rows do and do not fill its tiles, and at no rows; the sum fresh or
    # written over the residual
    dev = device_for("triton")
    g = torch.Generator().manual_seed(2)
    ln = kernels("layer_norm")
    rms = norm == "rms"
    for rows, width in ((37, 96), (64, 96), (5, 40), (0, 96)):
        x, res = (torch.randn(rows, width, generator=g).to(dev, dtype) for _ in range(2))
        w = (1 + torch.randn(width, generator=g)).to(dev)
        b = None if norm != "layer" else torch.randn(width, generator=g).to(dev, dtype)
        want = ln.add_layer_norm_forward(x, res, w, b, 1e-6, 0.0, None, with_sum, rms=rms)
        for over_residual in ((False, True) if with_sum else (False,)):
            xi, ri = x.clone(), res.clone()
            got = ln.add_layer_norm_inference(xi, ri, w, b, 1e-6, rms=rms, return_sum=with_sum,
                                              sum_out=ri if over_residual else None)
            y = got[0] if with_sum else got
            assert y.data_ptr() == xi.data_ptr() and torch.equal(y, want[0]), (rows, width)
            if with_sum:
                assert torch.equal(got[1], want[3]), (rows, width)
                assert rows == 0 or (got[1].data_ptr() == ri.data_ptr()) == over_residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bound_gelu_and_gated_units_give_the_launchers_bits(dtype):
    dev = device_for("triton")
    g = torch.Generator().manual_seed(3)
    for rows, width in ((19, 200), (32, 64), (0, 64)):
        x = (torch.randn(rows, width, generator=g) * 2).to(dev, dtype)
        b = torch.randn(width, generator=g).to(dev, dtype)
        for approximate in ("none", "tanh"):
            want = kernels("bias_gelu").bias_gelu_forward(x, b, approximate)
            xi = x.clone()
            got = kernels("bias_gelu").bias_gelu_inference(xi, b, approximate)
            assert got.data_ptr() == xi.data_ptr() and torch.equal(got, want), (rows, width, approximate)
        for approximate in ("none", "tanh", "silu"):
            want = kernels("geglu").geglu_forward(x, approximate)
            got = kernels("geglu").geglu_inference(x, approximate)
            assert got.shape == (rows, width // 2) and torch.equal(got, want), (rows, width, approximate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("packed", [False, True])
def test_attention_over_its_queries(dtype, packed):
    """The output written over q, a view into the QKV rows: the context is then their first third,
    and the keys and values are untouched."""
    dev = device_for("triton")
    g = torch.Generator().manual_seed(2)
    heads, d = 2, 16
    h = heads * d
    attn = kernels("attention")
    if packed:
        cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32, device=dev)
        qkv = torch.randn(23, 3 * h, generator=g).to(dev, dtype)

        def run(t, inplace=False, **kw):
            q, k, v = t.view(-1, 3, heads, d).unbind(1)
            out = q if inplace else None
            return attn.varlen_attention_forward(q, k, v, cu, 17, 1 / math.sqrt(d), 0.0, None, False, out=out, **kw)
    else:
        bsz, seq = 3, 13
        mask = torch.ones(bsz, seq, dtype=torch.bool, device=dev)
        mask[1, 6:] = False
        mask[2, 1:] = False
        qkv = torch.randn(bsz * seq, 3 * h, generator=g).to(dev, dtype)

        def run(t, inplace=False, **kw):
            q, k, v = t.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
            out = q if inplace else None
            return attn.attention_forward(q, k, v, mask, 1 / math.sqrt(d), 0.0, None, False, out=out, **kw)

    want, lse, _ = run(qkv)
    got, no_lse, _ = run(qkv, keep_lse=False)
    assert no_lse is None and torch.equal(got, want)
    over = qkv.clone()
    run(over, inplace=True, keep_lse=False)
    ctx = want.reshape(-1, h) if packed else want.transpose(1, 2).reshape(-1, h)
    assert torch.equal(over.narrow(1, 0, h), ctx)
    assert torch.equal(over.narrow(1, h, 2 * h), qkv.narrow(1, h, 2 * h)), "the keys or values were written"
    _, lse_again, _ = run(qkv)
    assert torch.equal(lse_again, lse)


def _qkv_case(layout, dev, dtype, g, heads=2, d=16, resized=False):
    """(qkv, key_mask, cu_seqlens, max_seqlen) of a small problem in `layout`: packed, padded with
    a key mask, padded without one at a length of whole tiles (EVEN) or not; resized: other sizes
    (tokens, sequences, the longest), the same specialization."""
    h = heads * d
    if layout == "packed":
        lengths = [3, 6] if resized else [5, 17, 1]
        cu = torch.tensor([0, *lengths], device=dev).cumsum(0).to(torch.int32)
        return torch.randn(sum(lengths), 3 * h, generator=g).to(dev, dtype), None, cu, max(lengths)
    # even: whole tiles of every kernel (fp16's forward takes 128 rows at a time)
    bsz, seq = (3, 13) if layout in ("masked", "unmasked") else (1, 64 if dtype == torch.float32 else 128)
    if resized:
        bsz, seq = (2, 9) if layout in ("masked", "unmasked") else (2, seq)
    mask = None
    if layout == "masked":
        mask = torch.ones(bsz, seq, dtype=torch.bool, device=dev)
        mask[1, 6:] = False
        mask[-1, 1:] = False
    return torch.randn(bsz * seq, 3 * h, generator=g).to(dev, dtype), mask, None, seq


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["packed", "masked", "unmasked", "even"])
@pytest.mark.parametrize("variant", ["plain", "rope", "window"])
def test_qkv_attention_bound_once_per_shape(dtype, layout, variant):
    """qkv_attention_forward for inference, whose launches are bound at a shape's first call, gives
    the launchers' bits at every call: the second call of a shape runs on its own tensors (new
    values, new memory), another shape in between takes its own launch, and a launch bound while
    the host counts skip every kernel runs its kernel when called after."""
    from fastbert.bench.host import launches_counted

    dev = device_for("triton")
    g = torch.Generator().manual_seed(3)
    heads, d = 2, 16
    attn = kernels("attention")
    extra = _qkv_extra(variant, d, dev)

    def got(qkv, mask, cu, n):
        over = qkv.clone()
        ctx, lse = attn.qkv_attention_forward(over, heads, mask, cu, n, 1 / math.sqrt(d), **extra)
        assert lse is None and ctx.data_ptr() == over.data_ptr()
        assert torch.equal(over.narrow(1, heads * d, 2 * heads * d), qkv.narrow(1, heads * d, 2 * heads * d))
        return ctx

    first = _qkv_case(layout, dev, dtype, g)
    if os.environ.get("TRITON_INTERPRET") == "1":
        with launches_counted() as tally:
            got(*first)  # bound here, with every launch counted and skipped
        assert tally.launches == 1 + (layout in ("masked", "unmasked"))  # the range kernel, for a mask
    assert torch.equal(got(*first), _unbound(attn, heads, d, extra, *first)[0])
    other = _qkv_case("packed" if layout != "packed" else "masked", dev, dtype, g)
    assert torch.equal(got(*other), _unbound(attn, heads, d, extra, *other)[0])
    second = _qkv_case(layout, dev, dtype, g)  # the first shape again, new values
    assert not torch.equal(second[0], first[0])
    assert torch.equal(got(*second), _unbound(attn, heads, d, extra, *second)[0])
    known = len(attn.launchers._BOUND)
    resized = _qkv_case(layout, dev, dtype, g, resized=True)  # other sizes: the same bound launches
    assert torch.equal(got(*resized), _unbound(attn, heads, d, extra, *resized)[0])
    assert len(attn.launchers._BOUND) == known


def test_qkv_attention_one_token_then_more():
    """A single token (whose strides the launchers pass as 0) and then a batch of the same
    specialization: each as the launchers give it."""
    dev = device_for("triton")
    g = torch.Generator().manual_seed(5)
    heads, d = 2, 16
    attn = kernels("attention")
    for lengths in ([1], [4, 7]):
        cu = torch.tensor([0, *lengths], device=dev).cumsum(0).to(torch.int32)
        qkv = torch.randn(sum(lengths), 3 * heads * d, generator=g).to(dev)
        want = _unbound(attn, heads, d, {}, qkv, None, cu, max(lengths))[0]
        over = qkv.clone()
        ctx, _ = attn.qkv_attention_forward(over, heads, None, cu, max(lengths), 1 / math.sqrt(d))
        assert torch.equal(ctx, want), lengths


F32, F16 = torch.float32, torch.float16


# each layout, each variant and each dtype at least once (the interpreter runs the backward slowly)
@pytest.mark.parametrize("layout,variant,dtype", [
    ("packed", "plain", F32), ("packed", "plain", F16), ("packed", "rope", F32), ("packed", "window", F16),
    ("masked", "plain", F32), ("masked", "rope", F16), ("unmasked", "plain", F32), ("even", "plain", F32),
    ("even", "window", F16)])
def test_qkv_attention_training_bound_once_per_shape(layout, variant, dtype):
    """The training route's forward (the context into its own rows, the log-sum-exp kept, dropout)
    and backward (dq, dk, dv into one QKV gradient), bound once per shape, against the launchers
    on the same views: the same bits in the output, the log-sum-exp and every gradient, at a
    shape's first call, after another shape, and again with new values and a new seed."""
    dev = device_for("triton")
    g = torch.Generator().manual_seed(4)
    heads, d = 2, 16
    h = heads * d
    attn = kernels("attention")
    extra = _qkv_extra(variant, d, dev)
    scale = 1 / math.sqrt(d)

    def check(case, seed):
        qkv, mask, cu, n = case
        want_out, want_lse, want_grads, dout = _unbound(attn, heads, d, extra, *case, dropout_p=0.25, seed=seed, g=g)
        out = torch.empty(qkv.shape[0], h, dtype=qkv.dtype, device=qkv.device)
        ctx, lse = attn.qkv_attention_forward(qkv, heads, mask, cu, n, scale, **extra, dropout_p=0.25, seed=seed,
                                              out=out, keep_lse=True)
        assert ctx is out and torch.equal(out, want_out) and torch.equal(lse, want_lse)
        dqkv = attn.qkv_attention_backward(dout, qkv, out, lse, heads, mask, cu, n, scale, **extra, dropout_p=0.25,
                                           seed=seed)
        for i, want in enumerate(want_grads):
            assert torch.equal(dqkv.narrow(1, i * h, h), want), "qkv"[i]

    check(_qkv_case(layout, dev, dtype, g), 11)
    check(_qkv_case("packed" if layout != "packed" else "masked", dev, dtype, g), 12)
    known = len(attn.launchers._BOUND)
    check(_qkv_case(layout, dev, dtype, g, resized=True), 13)  # other sizes, new values, a new seed
    assert len(attn.launchers._BOUND) == known


def _qkv_extra(variant, d, dev):
    from fastbert.reference import rotary_tables

    if variant == "rope":
        return dict(zip(("rope_cos", "rope_sin"), rotary_tables(10000.0, d, 128, dev)))
    return {"window": 3} if variant == "window" else {}


def _unbound(attn, heads, d, extra, qkv, mask, cu, n, dropout_p=0.0, seed=None, g=None):
    """The launchers' (context rows, lse, (dq, dk, dv) rows or None, the output gradient used) on
    the views of qkv; with g, the backward too, of a random output gradient."""
    h = heads * d
    packed = cu is not None
    q, k, v = (qkv.view(-1, 3, heads, d) if packed
               else qkv.view(-1, n, 3, heads, d).permute(2, 0, 3, 1, 4)).unbind(1 if packed else 0)
    scale = 1 / math.sqrt(d)
    if packed:
        out, lse, _ = attn.varlen_attention_forward(q, k, v, cu, n, scale, dropout_p, seed, False, **extra)
    else:
        out, lse, _ = attn.attention_forward(q, k, v, mask, scale, dropout_p, seed, False, **extra)

    def rows(t):
        return t.reshape(-1, h) if packed else t.transpose(1, 2).reshape(-1, h)

    if g is None:
        return rows(out), lse, None, None
    dout = torch.randn(qkv.shape[0], h, generator=g).to(qkv.device, qkv.dtype)
    do = dout.view(-1, heads, d) if packed else dout.view(-1, n, heads, d).transpose(1, 2)
    if packed:
        grads = attn.varlen_attention_backward(do, q, k, v, out, lse, cu, n, scale, dropout_p, seed, **extra)
    else:
        grads = attn.attention_backward(do, q, k, v, out, lse, mask, scale, dropout_p, seed, **extra)
    return rows(out), lse, tuple(rows(t) for t in grads), dout
