"""fastbert.ops.bias_gelu on every backend against the fp64 reference, forward and both gradients."""
import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.backends import device_for, dtypes_for
from tests.helpers.bounds import assert_within_bound, run_with_grads

# The interpreter is slow: the triton backend gets small shapes, the others real ones too.
SHAPES_SMALL = [(1, 1), (3, 7), (5, 384), (2, 1023), (2, 3, 768)]
SHAPES_LARGE = [(17, 384), (33, 768), (7, 1023), (9, 1024), (3, 4096), (2, 5, 3072)]


def shapes_for(backend):
    return SHAPES_SMALL if backend == "triton" else SHAPES_SMALL + SHAPES_LARGE


def check_bias_gelu(backend, shape, dtype, approximate, bias_dtype=None, seed=0):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = (torch.randn(shape, generator=g) * 2).to(dev, dtype)
    b = torch.randn(n, generator=g).to(dev, bias_dtype or dtype)
    dy = torch.randn(shape, generator=g).to(dev, dtype)

    def op(x_, b_):
        return fastbert.ops.bias_gelu(x_, b_, approximate, backend=backend)

    def ref(x_, b_):
        return reference.bias_gelu(x_, b_, approximate)

    out, (dx, db) = run_with_grads(op, [x, b], dy)
    pt, (pt_dx, pt_db) = run_with_grads(ref, [x, b], dy)
    r64, (r_dx, r_db) = run_with_grads(ref, [x.double(), b.double()], dy.double())
    tag = f"{backend} {tuple(shape)} {dtype} {approximate}"
    assert db.dtype == b.dtype, f"{tag}: dbias dtype {db.dtype} != bias dtype {b.dtype}"
    assert_within_bound(f"{tag} y", out, pt, r64, dtype)
    assert_within_bound(f"{tag} dx", dx, pt_dx, r_dx, dtype)
    assert_within_bound(f"{tag} dbias", db, pt_db, r_db, dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_matches_reference(backend, approximate):
    for i, shape in enumerate(shapes_for(backend)):
        for dtype in dtypes_for(backend):
            check_bias_gelu(backend, shape, dtype, approximate, seed=i)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_over_the_whole_range(backend, approximate):
    # a dense grid through the tails and the regions where the kernels switch formulas or clamp
    # (the cpp erf forward's rational fit meets 0 and 1 between |x| = 5.8 and 6.3)
    dev = device_for(backend)
    x = torch.linspace(-12.0, 12.0, 4 * 2048).view(4, 2048)
    x[0, :8] = torch.tensor([-6.3, -6.2, -6.0, -5.8, 5.8, 6.0, 6.2, 6.3])
    b = torch.zeros(x.shape[1])
    dy = torch.ones_like(x)
    for dtype in dtypes_for(backend):
        xs, bs, dys = x.to(dev, dtype), b.to(dev, dtype), dy.to(dev, dtype)
        out, (dx, _) = run_with_grads(lambda x_, b_: fastbert.ops.bias_gelu(x_, b_, approximate, backend=backend), [xs, bs], dys)
        pt, (pt_dx, _) = run_with_grads(lambda x_, b_: reference.bias_gelu(x_, b_, approximate), [xs, bs], dys)
        r64, (r_dx, _) = run_with_grads(
            lambda x_, b_: reference.bias_gelu(x_, b_, approximate), [xs.double(), bs.double()], dys.double()
        )
        assert_within_bound(f"{backend} {dtype} {approximate} y", out, pt, r64, dtype)
        assert_within_bound(f"{backend} {dtype} {approximate} dx", dx, pt_dx, r_dx, dtype)


def test_bias_gelu_fp32_bias_with_half_input(backend):
    # mixed precision: activations in half, the bias parameter kept in fp32
    check_bias_gelu(backend, (4, 768), torch.float16, "none", bias_dtype=torch.float32)


def test_bias_gelu_non_contiguous_input(backend):
    dev = device_for(backend)
    x = torch.randn(384, 6, device=dev).t()  # [6, 384], stride (1, 6)
    b = torch.randn(384, device=dev)
    assert not x.is_contiguous()
    y = fastbert.ops.bias_gelu(x, b, backend=backend)
    torch.testing.assert_close(y, reference.bias_gelu(x.double(), b.double()).float(), atol=1e-5, rtol=1e-5)


def test_bias_gelu_large_magnitudes_stay_finite(backend):
    dev = device_for(backend)
    x = torch.tensor([[-1e4, -30.0, -8.0, 0.0, 8.0, 30.0, 1e4, 3.0]], device=dev)
    b = torch.zeros(8, device=dev)
    for approximate in ("none", "tanh"):
        xl = x.clone().requires_grad_(True)
        y = fastbert.ops.bias_gelu(xl, b, approximate, backend=backend)
        y.sum().backward()
        ref = reference.bias_gelu(x.double(), b.double(), approximate)
        assert torch.isfinite(y).all() and torch.isfinite(xl.grad).all()
        torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-5)


def test_bias_gelu_empty_input(backend):
    dev = device_for(backend)
    y = fastbert.ops.bias_gelu(torch.empty(0, 16, device=dev), torch.zeros(16, device=dev), backend=backend)
    assert y.shape == (0, 16)


def test_bias_gelu_bad_input_errors():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"bias has shape \(7,\) but x has hidden size 8"):
        fastbert.ops.bias_gelu(x, torch.randn(7))
    with pytest.raises(ValueError, match="bias has shape"):
        fastbert.ops.bias_gelu(x, torch.randn(2, 8))
    with pytest.raises(TypeError, match="bias has dtype torch.float64"):
        fastbert.ops.bias_gelu(x, torch.randn(8, dtype=torch.float64))
    with pytest.raises(TypeError, match="bias has dtype torch.float16 but x has dtype torch.float32"):
        fastbert.ops.bias_gelu(x, torch.randn(8).half())
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        fastbert.ops.bias_gelu(torch.ones(4, 8, dtype=torch.int64), torch.randn(8))
    with pytest.raises(ValueError, match="approximate must be"):
        fastbert.ops.bias_gelu(x, torch.randn(8), "sigmoid")
    with pytest.raises(ValueError, match="unknown backend"):
        fastbert.ops.bias_gelu(x, torch.randn(8), backend="cuda")
