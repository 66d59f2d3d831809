"""fastbert.ops.add_layer_norm on every backend against the fp64 reference: forward and the four
gradients, with and without dropout (the mask is a function of the seed, the same on every backend)."""
import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.backends import device_for, dtypes_for, require
from tests.helpers.bounds import assert_within_bound, run_with_grads
from tests.helpers.layer_norm import make_inputs

# hidden 1 is left out: its variance is 0, rstd = 1/sqrt(eps) = 1e6 overflows torch's own fp16
# backward (NaN), so there is no baseline to compare with; constant rows are tested on their own.
SHAPES_SMALL = [(1, 2), (3, 7), (5, 384), (2, 1023), (2, 3, 768)]
SHAPES_LARGE = [(17, 384), (33, 768), (7, 1023), (9, 1024), (3, 4096), (2, 5, 3072), (2, 8192)]


def shapes_for(backend):
    return SHAPES_SMALL if backend == "triton" else SHAPES_SMALL + SHAPES_LARGE


def check_add_layer_norm(backend, shape, dtype, dropout_p=0.0, param_dtype=None, seed=0, eps=1e-12, bias=True):
    """bias=False: a LayerNorm without bias (bias=None), compared with F.layer_norm's (the
    gradients of x, residual and weight)."""
    dev = device_for(backend)
    x, res, w, b, dy = make_inputs(shape, dtype, dev, seed, param_dtype)
    dseed = 1000 + seed
    keep = reference.dropout_keep_mask(dseed, shape, dropout_p, dev) if dropout_p > 0 else None

    def op(*a):
        a = a if bias else (*a, None)
        return fastbert.ops.add_layer_norm(*a, eps, dropout_p=dropout_p, seed=dseed, backend=backend)

    def ref(*a):
        a = a if bias else (*a, None)
        return reference.add_layer_norm(*a, eps, dropout_p, keep_mask=keep)

    inputs = [x, res, w, b] if bias else [x, res, w]
    out, grads = run_with_grads(op, inputs, dy)
    pt, pt_grads = run_with_grads(ref, inputs, dy)
    r64, r_grads = run_with_grads(ref, [t.double() for t in inputs], dy.double())
    tag = f"{backend} {tuple(shape)} {dtype} p={dropout_p}{'' if bias else ' no bias'}"
    assert_within_bound(f"{tag} y", out, pt, r64, dtype)
    for name, gk, gp, gr in zip(["dx", "dresidual", "dweight", "dbias"], grads, pt_grads, r_grads):
        assert_within_bound(f"{tag} {name}", gk, gp, gr, dtype)
    return grads


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_add_layer_norm_matches_reference(backend, dropout_p):
    for i, shape in enumerate(shapes_for(backend)):
        for dtype in dtypes_for(backend):
            check_add_layer_norm(backend, shape, dtype, dropout_p, seed=i)


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_add_layer_norm_without_bias_matches_reference(backend, dropout_p):
    # ModernBERT's norms have no bias
    for i, shape in enumerate(shapes_for(backend)):
        for dtype in dtypes_for(backend):
            check_add_layer_norm(backend, shape, dtype, dropout_p, seed=i, bias=False)
    check_add_layer_norm(backend, (4, 768), torch.float16, dropout_p, param_dtype=torch.float32, bias=False)


def test_add_layer_norm_fp32_params_with_half_input(backend):
    check_add_layer_norm(backend, (4, 768), torch.float16, 0.1, param_dtype=torch.float32)


def test_add_layer_norm_dropout_mask_is_the_seeds_mask(backend):
    # dx is exactly zero where the element was dropped, and nowhere else: forward and backward
    # drew the mask of fastbert.reference.dropout_keep_mask from the same seed.
    dev = device_for(backend)
    shape, p = (6, 384), 0.3
    x, res, w, b, dy = make_inputs(shape, torch.float32, dev, 7)
    x.requires_grad_(True)
    y = fastbert.ops.add_layer_norm(x, res, w, b, dropout_p=p, seed=12345, backend=backend)
    y.backward(dy)
    keep = reference.dropout_keep_mask(12345, shape, p, dev)
    assert 0.6 < keep.float().mean().item() < 0.8
    assert torch.equal(x.grad != 0, keep)


def test_add_layer_norm_same_seed_same_output_different_seed_different(backend):
    dev = device_for(backend)
    x, res, w, b, _ = make_inputs((4, 384), torch.float32, dev, 3)
    run = lambda s: fastbert.ops.add_layer_norm(x, res, w, b, dropout_p=0.1, seed=s, backend=backend)  # noqa: E731
    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))
    torch.manual_seed(0)
    a = fastbert.ops.add_layer_norm(x, res, w, b, dropout_p=0.1, backend=backend)
    torch.manual_seed(0)
    assert torch.equal(a, fastbert.ops.add_layer_norm(x, res, w, b, dropout_p=0.1, backend=backend))


def test_add_layer_norm_non_contiguous_inputs(backend):
    dev = device_for(backend)
    x = torch.randn(384, 5, device=dev).t()
    res = torch.randn(5, 768, device=dev)[:, ::2]
    w, b = torch.randn(384, device=dev), torch.randn(384, device=dev)
    y = fastbert.ops.add_layer_norm(x, res, w, b, backend=backend)
    ref = reference.add_layer_norm(x.double(), res.double(), w.double(), b.double())
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)


def test_add_layer_norm_constant_rows_are_finite(backend):
    # variance 0: rstd = 1/sqrt(eps), output = bias, gradients finite
    dev = device_for(backend)
    x = torch.zeros(3, 768, device=dev, requires_grad=True)
    res = torch.full((3, 768), 2.5, device=dev)
    w, b = torch.randn(768, device=dev), torch.randn(768, device=dev)
    y = fastbert.ops.add_layer_norm(x, res, w, b, backend=backend)
    y.sum().backward()
    torch.testing.assert_close(y, b.expand(3, -1))
    assert torch.isfinite(x.grad).all()


def test_add_layer_norm_bad_input_errors():
    x, res, w, b = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), torch.randn(8)
    ln = fastbert.ops.add_layer_norm
    with pytest.raises(ValueError, match=r"residual has shape \(4, 7\) but x has shape \(4, 8\)"):
        ln(x, torch.randn(4, 7), w, b)
    with pytest.raises(ValueError, match=r"weight has shape \(9,\) but x has hidden size 8"):
        ln(x, res, torch.randn(9), b)
    with pytest.raises(ValueError, match=r"bias has shape \(7,\)"):
        ln(x, res, w, torch.randn(7))
    with pytest.raises(TypeError, match="residual has dtype torch.float16 but x has dtype torch.float32"):
        ln(x, res.half(), w, b)
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16 but x has dtype torch.float16"):
        ln(x.half(), res.half(), w.bfloat16(), b.bfloat16())
    with pytest.raises(TypeError, match="weight is torch.float32 but bias is torch.float16"):
        ln(x.half(), res.half(), w, b.half())
    with pytest.raises(ValueError, match="dropout_p must be in"):
        ln(x, res, w, b, dropout_p=1.0)
    with pytest.raises(ValueError, match="eps must be > 0"):
        ln(x, res, w, b, eps=0.0)
    with pytest.raises(ValueError, match="seed must be in"):
        ln(x, res, w, b, dropout_p=0.1, seed=-1)


@pytest.mark.parametrize("fused", ["cpp", pytest.param("triton", marks=pytest.mark.triton)])
def test_add_layer_norm_hidden_above_maximum(fused):
    require(fused)
    n = fastbert.ops.MAX_HIDDEN + 1
    x = torch.randn(2, n, device=device_for(fused))
    with pytest.raises(ValueError, match=f"hidden size {n} is above the supported maximum 8192"):
        fastbert.ops.add_layer_norm(x, x, torch.ones(n, device=x.device), torch.zeros(n, device=x.device), backend=fused)


def test_cpp_dropout_mask_is_bit_identical_to_the_reference():
    require("cpp")
    from fastbert.backend import cpp_function

    keep_mask = cpp_function("dropout_keep_mask")
    for m, n, p, seed in [(7, 1023, 0.1, 1000), (64, 768, 0.3, 12345), (3, 4096, 0.5, 2**62 + 3), (1, 5, 0.9, 0)]:
        got = keep_mask(m, n, p, seed)
        assert torch.equal(got, reference.dropout_keep_mask(seed, (m, n), p)), (m, n, p, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_results_do_not_depend_on_the_thread_count(dtype):
    # the parameter gradients are sums over rows: fixed chunks, fixed order, whatever the threads
    require("cpp")
    x, res, w, b, dy = make_inputs((1027, 768), dtype, "cpu", 5)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out, grads = run_with_grads(
                lambda *a: fastbert.ops.add_layer_norm(*a, dropout_p=0.1, seed=9, backend="cpp"), [x, res, w, b], dy
            )
            out2, grads2 = run_with_grads(lambda x_, b_: fastbert.ops.bias_gelu(x_, b_, backend="cpp"), [x, b], dy)
            results.append([out, *grads, out2, *grads2])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            assert torch.equal(a, b_)


@pytest.mark.parametrize("return_sum", [False, True])
def test_inference_gives_the_bits_of_the_training_forward(backend, return_sum):
    """Under no_grad the fused backends keep no statistics (nothing will read them): the outputs
    are still those of the forward that keeps them for a backward, dropout included."""
    dev = device_for(backend)
    x, res, w, b, _ = make_inputs((4, 7, 384), torch.float32, dev, 6)
    for p, bias in ((0.0, b), (0.1, None)):
        kw = dict(dropout_p=p, seed=11, return_sum=return_sum, backend=backend)
        with torch.no_grad():
            got = fastbert.ops.add_layer_norm(x, res, w, bias, 1e-5, **kw)
        want = fastbert.ops.add_layer_norm(x, res, w.requires_grad_(), bias, 1e-5, **kw)
        w.requires_grad_(False)
        for g_, w_ in zip(got if return_sum else (got,), want if return_sum else (want,)):
            assert torch.equal(g_, w_.detach()), (p, (g_ - w_).abs().max().item())
