"""fastbert.ops.add_rms_norm (add_layer_norm's kernels with no mean taken out and no bias) on every
backend against the fp64 reference (F.rms_norm): the output, the residual-stream sum (return_sum)
and the three gradients, with the gradient flowing through y, through the sum, and through both;
dropout too. Checked also against torch.nn.RMSNorm and the Llama-style RMSNorm of transformers'
EuroBERT, which the encoders use."""
import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.backends import device_for, dtypes_for, require
from tests.helpers.bounds import assert_within_bound
from tests.helpers.layer_norm import make_inputs, outputs_and_grads

# 2500: whole rows in the Triton backward without the sum's gradient, two passes with it (above 2048);
# 5000: two passes either way (above 4096)
SHAPES_SMALL = [(1, 2), (3, 7), (5, 384), (2, 3, 768), (2, 2500)]
SHAPES_LARGE = [(33, 768), (7, 1023), (2, 5, 3072), (3, 5000), (2, 8192)]
GRADS = ["dx", "dresidual", "dweight"]


def shapes_for(backend):
    return SHAPES_SMALL if backend == "triton" else SHAPES_SMALL + SHAPES_LARGE


def check_rms(backend, shape, dtype, through="plain", dropout_p=0.0, seed=0, param_dtype=None, eps=1e-6):
    dev = device_for(backend)
    x, res, w, _, dy = make_inputs(shape, dtype, dev, seed, param_dtype)
    ds = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 10_000)).to(dev, dtype)
    dseed = 1000 + seed
    keep = reference.dropout_keep_mask(dseed, shape, dropout_p, dev) if dropout_p > 0 else None
    return_sum = through != "plain"

    def op(*a):
        return fastbert.ops.add_rms_norm(*a, eps, dropout_p=dropout_p, seed=dseed, return_sum=return_sum,
                                         backend=backend)

    def ref(*a):
        return reference.add_rms_norm(*a, eps, dropout_p, keep_mask=keep, return_sum=return_sum)

    inputs = [x, res, w]
    outs, grads = outputs_and_grads(op, inputs, dy, ds, through)
    pt_outs, pt_grads = outputs_and_grads(ref, inputs, dy, ds, through)
    r64_outs, r64_grads = outputs_and_grads(ref, [t.double() for t in inputs], dy.double(), ds.double(), through)
    tag = f"{backend} {tuple(shape)} {dtype} p={dropout_p} through {through}"
    for name, a, p, r in zip(["y", "s"], outs, pt_outs, r64_outs):
        assert a.dtype == dtype, f"{tag} {name}: dtype {a.dtype}"
        assert_within_bound(f"{tag} {name}", a, p, r, dtype)
    for name, a, p, r in zip(GRADS, grads, pt_grads, r64_grads):
        if r is None:  # through s only: the norm's weight gets no gradient
            assert a is None and p is None, f"{tag} {name}: a gradient where none flows"
        else:
            assert_within_bound(f"{tag} {name}", a, p, r, dtype)
    return outs, grads


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("through", ["plain", "both", "y", "s"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_outputs_and_gradients_match_the_reference(backend, dropout_p, through):
    for i, shape in enumerate(shapes_for(backend)):
        for dtype in dtypes_for(backend):
            check_rms(backend, shape, dtype, through, dropout_p, seed=i)


def test_fp32_params_with_half_input(backend):
    check_rms(backend, (4, 768), torch.float16, "both", 0.1, param_dtype=torch.float32)


def test_it_is_torch_rmsnorm_and_eurobert_rmsnorm(backend):
    # the module forms: torch.nn.RMSNorm (the functional's), transformers' Llama-style RMSNorm (fp32
    # statistics, the weight applied in the input's dtype) as EuroBERT's layers hold it
    from transformers.models.eurobert.modeling_eurobert import EuroBertRMSNorm

    dev = device_for(backend)
    x, res, w, _, _ = make_inputs((6, 384), torch.float32, dev, 11)
    mine = fastbert.ops.add_rms_norm(x, res, w, 1e-5, backend=backend)
    torch_norm = torch.nn.RMSNorm(384, eps=1e-5).to(dev)
    theirs = EuroBertRMSNorm(384, eps=1e-5).to(dev)
    with torch.no_grad():
        torch_norm.weight.copy_(w)
        theirs.weight.copy_(w)
        torch.testing.assert_close(mine, torch_norm(x + res), atol=2e-6, rtol=2e-6)
        torch.testing.assert_close(mine, theirs(x + res), atol=2e-6, rtol=2e-6)


def test_the_mean_is_not_taken_out(backend):
    # a row of one constant c: LayerNorm gives 0 (then the bias), RMSNorm gives sign(c) * weight
    dev = device_for(backend)
    for dtype in dtypes_for(backend):
        x = torch.full((3, 384), 2.5, device=dev, dtype=dtype)
        w = torch.linspace(0.5, 1.5, 384, device=dev, dtype=dtype)
        y = fastbert.ops.add_rms_norm(x, -3 * x, w, backend=backend)  # h = -5 everywhere
        torch.testing.assert_close(y, (-w).expand_as(y), atol=1e-3, rtol=1e-3, msg=f"{backend} {dtype}")


def test_the_sum_is_x_plus_residual_exactly(backend):
    dev = device_for(backend)
    for dtype in dtypes_for(backend):
        x, res, w, _, _ = make_inputs((5, 1023), dtype, dev, 4)
        _, s = fastbert.ops.add_rms_norm(x, res, w, return_sum=True, backend=backend)
        assert torch.equal(s, x + res), f"{backend} {dtype}"


@pytest.mark.parametrize("return_sum", [False, True])
def test_inference_gives_the_bits_of_the_training_forward(backend, return_sum):
    dev = device_for(backend)
    x, res, w, _, _ = make_inputs((3, 5, 384), torch.float32, dev, 5)
    with torch.no_grad():
        inference = fastbert.ops.add_rms_norm(x, res, w, return_sum=return_sum, backend=backend)
    training = fastbert.ops.add_rms_norm(x, res, w.clone().requires_grad_(True), return_sum=return_sum,
                                         backend=backend)
    for a, b in zip(*(o if return_sum else (o,) for o in (inference, training))):
        assert torch.equal(a, b.detach())


def test_empty_rows(backend):
    dev = device_for(backend)
    x = torch.zeros(0, 384, device=dev, requires_grad=True)
    y = fastbert.ops.add_rms_norm(x, x, torch.ones(384, device=dev), backend=backend)
    assert y.shape == (0, 384)


def test_bad_input_errors():
    x, w = torch.randn(2, 8), torch.ones(8)
    with pytest.raises(ValueError, match=r"add_rms_norm: eps must be > 0"):
        fastbert.ops.add_rms_norm(x, x, w, 0.0)
    with pytest.raises(ValueError, match=r"add_rms_norm: residual has shape"):
        fastbert.ops.add_rms_norm(x, x[:1], w)
    with pytest.raises(ValueError, match=r"add_rms_norm: dropout_p must be in \[0, 1\)"):
        fastbert.ops.add_rms_norm(x, x, w, dropout_p=1.0)


def test_the_extension_refuses_a_bias_with_rms():
    require("cpp")
    from fastbert import backend

    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="an RMSNorm .* takes no bias"):
        backend.cpp_extension().add_layer_norm_forward(x, x, torch.ones(8), torch.zeros(8), 1e-6, rms=True)


def test_compile_fullgraph_matches_eager():
    require("cpp")
    g = torch.Generator().manual_seed(9)
    x, res, dy, ds = (torch.randn(4, 7, 64, generator=g) for _ in range(4))
    w = 1 + 0.5 * torch.randn(64, generator=g)

    def fn(x_, r_, w_):
        y, s = fastbert.ops.add_rms_norm(x_, r_, w_, dropout_p=0.1, seed=5, return_sum=True, backend="cpp")
        return y * 2, s

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for through in ("both", "y", "s"):
        eager = outputs_and_grads(fn, [x, res, w], dy, ds, through)
        got = outputs_and_grads(compiled, [x, res, w], dy, ds, through)
        for a, e in zip(got[0] + got[1], eager[0] + eager[1]):
            e = torch.zeros_like(a) if e is None and a is not None else e
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=through)


@pytest.mark.triton
def test_the_build_report_lists_the_rms_variants_the_launchers_pick():
    pytest.importorskip("triton")
    from fastbert.kernels import layer_norm

    listed = {(b.name, b.config.get("rms", False), b.config.get("bias"), b.config["BLOCK_N"], b.num_warps)
              for b in layer_norm.report_configs()}
    for n in (1, 7, 384, 768, 1023, 2048, 2049, 4096, 4097, 8192):
        s = layer_norm.settings(n)
        assert ("add_layer_norm_fwd", True, False, s.block_n, s.num_warps) in listed, n
        assert ("add_layer_norm_fwd", True, True, s.block_n, s.num_warps) not in listed, n  # no bias with RMS
        s = layer_norm.settings(n, backward=True)
        if s is None:
            s = layer_norm.TILED_SETTINGS
            assert ("add_layer_norm_bwd_tiled", True, None, s.block_n, s.num_warps) in listed, n
        else:
            assert ("add_layer_norm_bwd", True, None, s.block_n, s.num_warps) in listed, n
