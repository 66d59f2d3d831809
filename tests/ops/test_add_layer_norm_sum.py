"""fastbert.ops.add_layer_norm(..., return_sum=True) -> (y, s), s = dropout(x) + residual, on every
backend against the fp64 reference: both outputs and the four gradients, with the gradient flowing
through y only, through s only, and through both; dropout and no bias too. The default form is
unchanged: y is bit for bit the default's, and so are the gradients when only y is used."""
import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.backends import device_for, dtypes_for, require
from tests.helpers.bounds import assert_within_bound
from tests.helpers.layer_norm import make_inputs as base_inputs
from tests.helpers.layer_norm import outputs_and_grads

# 2500: the Triton backward takes whole rows without the sum's gradient, two passes with it (above 2048)
SHAPES_SMALL = [(1, 2), (3, 7), (5, 384), (2, 3, 768), (2, 2500)]
SHAPES_LARGE = [(33, 768), (7, 1023), (2, 5, 3072), (2, 8192)]
GRADS = ["dx", "dresidual", "dweight", "dbias"]


def shapes_for(backend):
    return SHAPES_SMALL if backend == "triton" else SHAPES_SMALL + SHAPES_LARGE


def make_inputs(shape, dtype, dev, seed, param_dtype=None):
    """x, residual, weight, bias, dy (test_add_layer_norm's), and ds: fresh seeded values (never zeros)."""
    g = torch.Generator().manual_seed(seed + 10_000)
    return (*base_inputs(shape, dtype, dev, seed, param_dtype), torch.randn(shape, generator=g).to(dev, dtype))


def check_sum(backend, shape, dtype, through="both", dropout_p=0.0, bias=True, seed=0, param_dtype=None, eps=1e-12):
    dev = device_for(backend)
    x, res, w, b, dy, ds = make_inputs(shape, dtype, dev, seed, param_dtype)
    dseed = 1000 + seed
    keep = reference.dropout_keep_mask(dseed, shape, dropout_p, dev) if dropout_p > 0 else None

    def op(*a):
        a = a if bias else (*a, None)
        return fastbert.ops.add_layer_norm(*a, eps, dropout_p=dropout_p, seed=dseed, return_sum=True, backend=backend)

    def ref(*a):
        a = a if bias else (*a, None)
        return reference.add_layer_norm(*a, eps, dropout_p, keep_mask=keep, return_sum=True)

    inputs = [x, res, w, b] if bias else [x, res, w]
    outs, grads = outputs_and_grads(op, inputs, dy, ds, through)
    pt_outs, pt_grads = outputs_and_grads(ref, inputs, dy, ds, through)
    r64_outs, r64_grads = outputs_and_grads(ref, [t.double() for t in inputs], dy.double(), ds.double(), through)
    tag = f"{backend} {tuple(shape)} {dtype} p={dropout_p} through {through}{'' if bias else ' no bias'}"
    for name, a, p, r in zip(["y", "s"], outs, pt_outs, r64_outs):
        assert a.dtype == dtype, f"{tag} {name}: dtype {a.dtype}"
        assert_within_bound(f"{tag} {name}", a, p, r, dtype)
    for name, a, p, r in zip(GRADS, grads, pt_grads, r64_grads):
        if r is None:  # through s only: the norm's weight and bias get no gradient
            assert a is None and p is None, f"{tag} {name}: a gradient where none flows"
        else:
            assert_within_bound(f"{tag} {name}", a, p, r, dtype)
    return outs, grads


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])  # no bias (None): ModernBERT's norms
@pytest.mark.parametrize("through", ["both", "y", "s"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_outputs_and_gradients_match_the_reference(backend, dropout_p, through, bias):
    for i, shape in enumerate(shapes_for(backend)):
        for dtype in dtypes_for(backend):
            check_sum(backend, shape, dtype, through, dropout_p, bias=bias, seed=i)
    check_sum(backend, (4, 768), torch.float16, through, dropout_p, bias=bias, param_dtype=torch.float32)


def test_fp32_params_with_half_input(backend):
    check_sum(backend, (4, 768), torch.float16, "both", 0.1, param_dtype=torch.float32)


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_y_and_its_gradients_are_the_defaults_bit_for_bit(backend, dropout_p):
    dev = device_for(backend)
    for dtype in dtypes_for(backend):
        x, res, w, b, dy, _ = make_inputs((6, 384), dtype, dev, 3)
        results = []
        for return_sum in (False, True):
            leaves = [t.clone().requires_grad_(True) for t in (x, res, w, b)]
            out = fastbert.ops.add_layer_norm(*leaves, dropout_p=dropout_p, seed=77, return_sum=return_sum,
                                              backend=backend)
            y = out[0] if return_sum else out
            y.backward(dy)
            results.append([y.detach()] + [t.grad for t in leaves])
        for name, a, b_ in zip(["y"] + GRADS, *results):
            assert torch.equal(a, b_), f"{backend} {dtype} p={dropout_p}: {name} differs from the default form's"


def test_the_sum_is_x_plus_residual_exactly(backend):
    # without dropout s is x + residual rounded once to x's dtype, as torch's own addition gives it
    dev = device_for(backend)
    for dtype in dtypes_for(backend):
        x, res, w, b, _, _ = make_inputs((5, 1023), dtype, dev, 4)
        _, s = fastbert.ops.add_layer_norm(x, res, w, b, return_sum=True, backend=backend)
        assert torch.equal(s, x + res), f"{backend} {dtype}"


def test_the_sums_gradient_alone_passes_through_dropout(backend):
    # through s only: dresidual is ds exactly, dx is ds on the kept elements (scaled), 0 on the dropped
    dev = device_for(backend)
    shape, p = (6, 384), 0.3
    _, grads = check_sum(backend, shape, torch.float32, "s", p, seed=7)
    x, res, w, b, dy, ds = make_inputs(shape, torch.float32, dev, 7)
    keep = reference.dropout_keep_mask(1007, shape, p, dev)
    assert torch.equal(grads[1], ds)
    assert torch.equal(grads[0] != 0, keep & (ds != 0))
    torch.testing.assert_close(grads[0], ds * keep / (1 - p), atol=0, rtol=2e-7)


def test_inference_returns_both_without_autograd(backend):
    dev = device_for(backend)
    x, res, w, b, _, _ = make_inputs((3, 5, 384), torch.float32, dev, 5)
    with torch.no_grad():
        y, s = fastbert.ops.add_layer_norm(x, res, w, b, return_sum=True, backend=backend)
    want_y, want_s = reference.add_layer_norm(x, res, w, b, return_sum=True)
    assert y.shape == s.shape == x.shape and not y.requires_grad and not s.requires_grad
    torch.testing.assert_close(y, want_y, atol=1e-5, rtol=1e-5)
    assert torch.equal(s, want_s)


def test_empty_rows(backend):
    dev = device_for(backend)
    x = torch.zeros(0, 384, device=dev, requires_grad=True)
    w, b = torch.ones(384, device=dev), torch.zeros(384, device=dev)
    y, s = fastbert.ops.add_layer_norm(x, x, w, b, return_sum=True, backend=backend)
    assert y.shape == s.shape == (0, 384)


def test_compile_fullgraph_matches_eager():
    require("cpp")
    x, res, w, b, dy, ds = make_inputs((4, 7, 64), torch.float32, "cpu", 9)

    def fn(x_, r_, w_, b_):
        y, s = fastbert.ops.add_layer_norm(x_, r_, w_, b_, dropout_p=0.1, seed=5, return_sum=True, backend="cpp")
        return y * 2, s

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for through in ("both", "y", "s"):
        eager = outputs_and_grads(fn, [x, res, w, b], dy, ds, through)
        got = outputs_and_grads(compiled, [x, res, w, b], dy, ds, through)
        for a, e in zip(got[0] + got[1], eager[0] + eager[1]):
            # (through s only, the compiled backward gives zeros for weight and bias where eager gives None)
            e = torch.zeros_like(a) if e is None and a is not None else e
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=through)


@pytest.mark.triton
def test_the_build_report_lists_the_sum_variants_the_launchers_pick():
    pytest.importorskip("triton")
    from fastbert.kernels import layer_norm

    listed = {(b.name, b.config.get("sum", b.config.get("dsum")), b.config["BLOCK_N"], b.num_warps, b.maxnreg)
              for b in layer_norm.report_configs()}
    for n in (1, 7, 384, 768, 1023, 2048, 2049, 3072, 4096, 4097, 8192):
        s = layer_norm.settings(n, with_sum=True)
        assert ("add_layer_norm_fwd", True, s.block_n, s.num_warps, s.maxnreg) in listed, n
        s = layer_norm.settings(n, backward=True, with_sum=True)
        if s is None:  # the two passes, the sum's gradient added in the second
            s = layer_norm.TILED_SETTINGS
            assert ("add_layer_norm_bwd_tiled", True, s.block_n, s.num_warps, s.maxnreg) in listed, n
        else:
            assert ("add_layer_norm_bwd", True, s.block_n, s.num_warps, s.maxnreg) in listed, n
