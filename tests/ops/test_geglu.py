"""fastbert.ops.geglu on every backend against the fp64 reference, forward and gradient."""
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


def check_geglu(backend, x, dy, approximate, tag):
    def op(x_):
        return fastbert.ops.geglu(x_, approximate, backend=backend)

    def ref(x_):
        return reference.geglu(x_, approximate)

    out, (dx,) = run_with_grads(op, [x], dy)
    pt, (pt_dx,) = run_with_grads(ref, [x], dy)
    r64, (r_dx,) = run_with_grads(ref, [x.double()], dy.double())
    assert_within_bound(f"{tag} y", out, pt, r64, x.dtype)
    assert_within_bound(f"{tag} dx", dx, pt_dx, r_dx, x.dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu_matches_reference(backend, approximate):
    dev = device_for(backend)
    for i, shape in enumerate(shapes_for(backend)):
        g = torch.Generator().manual_seed(i)
        for dtype in dtypes_for(backend):
            x = (torch.randn(shape, generator=g) * 2).to(dev, dtype)
            dy = torch.randn((*shape[:-1], shape[-1] // 2), generator=g).to(dev, dtype)
            check_geglu(backend, x, dy, approximate, f"{backend} {shape} {dtype} {approximate}")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu_over_the_whole_range(backend, approximate):
    # a dense grid of a through the GELU's tails and the points where the kernels clamp, b = 1 + a
    dev = device_for(backend)
    a = torch.linspace(-12.0, 12.0, 4 * 1024).view(4, 1024)
    a[0, :8] = torch.tensor([-6.3, -6.2, -6.0, -5.8, 5.8, 6.0, 6.2, 6.3])
    x = torch.cat([a, 1 + a], dim=-1)
    for dtype in dtypes_for(backend):
        check_geglu(backend, x.to(dev, dtype), torch.ones_like(a).to(dev, dtype), approximate, f"{backend} {dtype}")


def test_geglu_non_contiguous_input(backend):
    dev = device_for(backend)
    x = torch.randn(768, 6, device=dev).t()  # [6, 768], stride (1, 6)
    assert not x.is_contiguous()
    y = fastbert.ops.geglu(x, backend=backend)
    torch.testing.assert_close(y, reference.geglu(x.double()).float(), atol=1e-5, rtol=1e-5)


def test_geglu_empty_input(backend):
    dev = device_for(backend)
    assert fastbert.ops.geglu(torch.empty(0, 16, device=dev), backend=backend).shape == (0, 8)


def test_geglu_bad_input_errors():
    with pytest.raises(ValueError, match=r"last dim must be even .* got shape \(4, 7\)"):
        fastbert.ops.geglu(torch.randn(4, 7))
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        fastbert.ops.geglu(torch.ones(4, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="approximate must be"):
        fastbert.ops.geglu(torch.randn(4, 8), "sigmoid")
    with pytest.raises(ValueError, match="unknown backend"):
        fastbert.ops.geglu(torch.randn(4, 8), backend="cuda")
