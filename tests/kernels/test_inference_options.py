"""The Triton launchers' inference options (fastbert.ops.encoder's route on CUDA): an output written
over an input that dies with the call, and the statistics only a backward reads left unkept. Each
must give the same bits as the plain call, which the op tests compare with the reference; and a
plain call after them must find its statistics as before (the sink they write is nobody's)."""
import math

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
