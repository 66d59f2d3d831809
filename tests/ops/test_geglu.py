"""fastbert.ops.geglu and fastbert.ops.swiglu on every backend against the fp64 reference, forward and gradient."""
import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.backends import device_for, dtypes_for
from tests.helpers.bounds import assert_within_bound, run_with_grads

# [..., 2d]: the interpreter is slow, so the triton backend gets small shapes, the others real ones
# too (ModernBERT-base: 2 x 1152; mmBERT-small: 2 x 1152; odd halves end in partial vectors)
SHAPES_SMALL = [(1, 2), (3, 14), (5, 384), (2, 1022), (2, 3, 768)]
SHAPES_LARGE = [(17, 2 * 1152), (33, 768), (7, 2046), (9, 2 * 2624), (2, 5, 2 * 1152)]


def shapes_for(backend):
    return SHAPES_SMALL if backend == "triton" else SHAPES_SMALL + SHAPES_LARGE


# the gates: GELU's two forms (geglu) and SiLU (swiglu)
GATES = ["none", "tanh", "silu"]


def check_geglu(backend, x, dy, approximate, tag):
    def op(x_):
        if approximate == "silu":
            return fastbert.ops.swiglu(x_, backend=backend)
        return fastbert.ops.geglu(x_, approximate, backend=backend)

    def ref(x_):
        return reference.swiglu(x_) if approximate == "silu" else reference.geglu(x_, approximate)

    out, (dx,) = run_with_grads(op, [x], dy)
    pt, (pt_dx,) = run_with_grads(ref, [x], dy)
    r64, (r_dx,) = run_with_grads(ref, [x.double()], dy.double())
    assert_within_bound(f"{tag} y", out, pt, r64, x.dtype)
    assert_within_bound(f"{tag} dx", dx, pt_dx, r_dx, x.dtype)


@pytest.mark.parametrize("approximate", GATES)
def test_geglu_matches_reference(backend, approximate):
    dev = device_for(backend)
    for i, shape in enumerate(shapes_for(backend)):
        g = torch.Generator().manual_seed(i)
        for dtype in dtypes_for(backend):
            x = (torch.randn(shape, generator=g) * 2).to(dev, dtype)
            dy = torch.randn((*shape[:-1], shape[-1] // 2), generator=g).to(dev, dtype)
            check_geglu(backend, x, dy, approximate, f"{backend} {shape} {dtype} {approximate}")


@pytest.mark.parametrize("approximate", GATES)
def test_geglu_over_the_whole_range(backend, approximate):
    # a dense grid of a through the activation's tails and the points where the kernels clamp (GELU's
    # fit at 5.8-6.3; SiLU's exp at -80 and 100), b = 1 + a
    dev = device_for(backend)
    a = torch.linspace(-12.0, 12.0, 4 * 1024).view(4, 1024)
    a[0, :8] = torch.tensor([-6.3, -6.2, -6.0, -5.8, 5.8, 6.0, 6.2, 6.3])
    a[1, :8] = torch.tensor([-120.0, -100.0, -80.5, -80.0, -79.5, 99.5, 100.5, 120.0])
    x = torch.cat([a, 1 + a], dim=-1)
    for dtype in dtypes_for(backend):
        check_geglu(backend, x.to(dev, dtype), torch.ones_like(a).to(dev, dtype), approximate, f"{backend} {dtype}")


def test_geglu_non_contiguous_input(backend):
    dev = device_for(backend)
    x = torch.randn(768, 6, device=dev).t()  # [6, 768], stride (1, 6)
    assert not x.is_contiguous()
    y = fastbert.ops.geglu(x, backend=backend)
    torch.testing.assert_close(y, reference.geglu(x.double()).float(), atol=1e-5, rtol=1e-5)
    y = fastbert.ops.swiglu(x, backend=backend)
    torch.testing.assert_close(y, reference.swiglu(x.double()).float(), atol=1e-5, rtol=1e-5)


def test_geglu_empty_input(backend):
    dev = device_for(backend)
    assert fastbert.ops.geglu(torch.empty(0, 16, device=dev), backend=backend).shape == (0, 8)
    assert fastbert.ops.swiglu(torch.empty(0, 16, device=dev), backend=backend).shape == (0, 8)


def test_swiglu_is_not_geglu(backend):
    # the gate's activation reaches the kernel: SiLU and GELU differ by up to 0.2 at these values
    dev = device_for(backend)
    x = torch.linspace(-4, 4, 64).view(2, 32).to(dev)
    assert (fastbert.ops.swiglu(x, backend=backend) - fastbert.ops.geglu(x, backend=backend)).abs().max() > 0.1


def test_geglu_bad_input_errors():
    with pytest.raises(ValueError, match=r"last dim must be even .* got shape \(4, 7\)"):
        fastbert.ops.geglu(torch.randn(4, 7))
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        fastbert.ops.geglu(torch.ones(4, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="approximate must be"):
        fastbert.ops.geglu(torch.randn(4, 8), "sigmoid")
    with pytest.raises(ValueError, match="approximate must be"):
        fastbert.ops.geglu(torch.randn(4, 8), "silu")  # SiLU is swiglu's
    with pytest.raises(ValueError, match="unknown backend"):
        fastbert.ops.geglu(torch.randn(4, 8), backend="cuda")
    with pytest.raises(ValueError, match=r"swiglu: x's last dim must be even .* got shape \(3, 5\)"):
        fastbert.ops.swiglu(torch.randn(3, 5))
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        fastbert.ops.swiglu(torch.ones(4, 8, dtype=torch.int32))
