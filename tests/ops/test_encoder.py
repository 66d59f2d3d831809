"""fastbert.ops.encoder_layer (fastbert.ops.encoder): one post-LN encoder layer in one call. On each backend it must give
bit for bit what the separate ops give for the same layer (it calls the same kernels), padded and
packed, with MPNet's relative bias and both GELU forms; the models running it must give bit for bit
what they gave through the separate ops; and its checks must refuse what the kernels cannot take."""

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert import layouts
from fastbert.ops.encoder import LayerWeights, encoder_layer, separate_ops
from tests.helpers.backends import device_for, require


def weights(hidden, ffn, g, dtype=torch.float32, device="cpu"):
    def t(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    return LayerWeights(t(3 * hidden, hidden), t(3 * hidden), t(hidden, hidden), t(hidden), 1 + t(hidden), t(hidden),
                        t(ffn, hidden), t(ffn), t(hidden, ffn), t(hidden), 1 + t(hidden), t(hidden))


def packed_case(lengths, hidden, g, device="cpu"):
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
    return torch.randn(sum(lengths), hidden, generator=g).to(device), cu, max(lengths)


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_same_bits_as_theseparate_ops(backend, approximate):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(0)
    hidden, heads, ffn = 64, 4, 96
    w = weights(hidden, ffn, g, device=dev)
    eps = (1e-12, 1e-5)
    x = torch.randn(3, 11, hidden, generator=g).to(dev)
    mask = torch.ones(3, 11, dtype=torch.bool, device=dev)
    mask[1, 7:] = False
    mask[2, 3:] = False
    rel = layouts.relative_bias(torch.randn(32, heads, generator=g), 11).to(dev)
    cases = [dict(), dict(attention_mask=mask), dict(attention_mask=mask.long(), relative_bias=rel)]
    with torch.no_grad():
        for kw in cases:
            got = encoder_layer(x, w, heads=heads, eps=eps, approximate=approximate, backend=backend, **kw)
            mask_b = None if "attention_mask" not in kw else kw["attention_mask"].bool()
            want = separate_ops(x, w, heads, eps, approximate, mask_b, None, None, kw.get("relative_bias"), backend)
            assert got.shape == x.shape and got.dtype == x.dtype
            assert torch.equal(got, want), f"{backend} {sorted(kw)}: {(got - want).abs().max().item():.3e}"
        xp, cu, n = packed_case([5, 11, 1], hidden, g, dev)
        for rel_ in (None, rel):
            got = encoder_layer(xp, w, heads=heads, eps=eps, approximate=approximate, cu_seqlens=cu, max_seqlen=n,
                                relative_bias=rel_, backend=backend)
            want = separate_ops(xp, w, heads, eps, approximate, None, cu, n, rel_, backend)
            assert torch.equal(got, want), f"{backend} packed: {(got - want).abs().max().item():.3e}"


def test_matches_the_layer_written_in_torch():
    """Against the layer spelled out in plain torch (not through any fastbert op), fp64."""
    g = torch.Generator().manual_seed(1)
    hidden, heads, ffn = 32, 2, 48
    w = weights(hidden, ffn, g, dtype=torch.float64)
    x = torch.randn(2, 9, hidden, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5])
    d = hidden // heads
    qkv = F.linear(x, w.qkv_weight, w.qkv_bias).view(2, 9, 3, heads, d).permute(2, 0, 3, 1, 4)
    scores = qkv[0] @ qkv[1].transpose(-1, -2) / d ** 0.5 + (1 - mask[:, None, None, :].double()) * -1e9
    ctx = (scores.softmax(-1) @ qkv[2]).transpose(1, 2).reshape(2, 9, hidden)
    h1 = F.layer_norm(F.linear(ctx, w.out_weight, w.out_bias) + x, (hidden,), w.norm1_weight, w.norm1_bias, 1e-12)
    inter = F.gelu(F.linear(h1, w.ffn_in_weight, w.ffn_in_bias))
    want = F.layer_norm(F.linear(inter, w.ffn_out_weight, w.ffn_out_bias) + h1, (hidden,), w.norm2_weight,
                        w.norm2_bias, 1e-12)
    with torch.no_grad():
        for backend in ("torch", "cpp"):
            got = encoder_layer(x.float(), LayerWeights(*(t.float() for t in w)), heads=heads, eps=(1e-12, 1e-12),
                                attention_mask=mask, backend=backend)
            real = mask.bool()
            err = (got.double() - want)[real].abs().max().item()
            assert err < 2e-5, f"{backend}: {err:.3e}"


def test_refuses_what_it_cannot_take():
    g = torch.Generator().manual_seed(2)
    w = weights(32, 48, g)
    x = torch.randn(2, 5, 32, generator=g)
    with torch.no_grad():
        with pytest.raises(ValueError, match="heads must be an int >= 1 dividing the hidden size 32"):
            encoder_layer(x, w, heads=5, eps=(1e-12, 1e-12))
        with pytest.raises(ValueError, match="out_weight has shape"):
            encoder_layer(x, w._replace(out_weight=torch.zeros(32, 31)), heads=4, eps=(1e-12, 1e-12))
        with pytest.raises(TypeError, match="ffn_in_weight has dtype torch.float64"):
            encoder_layer(x, w._replace(ffn_in_weight=w.ffn_in_weight.double()), heads=4, eps=(1e-12, 1e-12))
        with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 4\)"):
            encoder_layer(x, w, heads=4, eps=(1e-12, 1e-12), attention_mask=torch.ones(2, 4))
        with pytest.raises(ValueError, match="hidden must be"):
            encoder_layer(x[0], w, heads=4, eps=(1e-12, 1e-12))
        xp, cu, n = packed_case([2, 3], 32, g)
        with pytest.raises(ValueError, match="not both"):
            encoder_layer(xp, w, heads=4, eps=(1e-12, 1e-12), cu_seqlens=cu, max_seqlen=n, attention_mask=torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="inference only"):
        encoder_layer(x, w._replace(out_weight=w.out_weight.requires_grad_()), heads=4, eps=(1e-12, 1e-12))


@pytest.mark.parametrize("family", ["bert", "distilbert", "mpnet"])
def test_models_give_the_same_bits_through_it(family, monkeypatch):
    """A model in inference mode runs each layer in one call (encoder_layer, or once the GEMM paths
    are measured the model's own one C++ call, or all its layers in one: fastbert.ops.encoder); grad
    mode on, the separate ops. Both must give the same bits, padded (no padding) and packed (padding)."""
    import transformers

    import fastbert.model.layers as layers
    from fastbert.ops import encoder

    calls = []  # a layer run on the inference route: one by one (layer_forward), or all in one call
    real, whole = layers.layer_forward, encoder.encoder_stack
    monkeypatch.setattr(layers, "layer_forward", lambda *a: calls.append(1) or real(*a))

    def stack_spy(hidden, tensors, *args, **kwargs):
        out = whole(hidden, tensors, *args, **kwargs)
        if out is not None:
            calls.extend([1] * len(tensors))
        return out

    monkeypatch.setattr(encoder, "encoder_stack", stack_spy)
    small = dict(hidden_size=64, num_attention_heads=4, intermediate_size=96, num_hidden_layers=2, vocab_size=120)
    if family == "distilbert":
        small = dict(dim=64, n_heads=4, hidden_dim=96, n_layers=2, vocab_size=120)
    cls = {"bert": "BertModel", "distilbert": "DistilBertModel", "mpnet": "MPNetModel"}[family]
    config = getattr(transformers, cls.replace("Model", "Config"))(**small)
    torch.manual_seed(0)
    model = getattr(fastbert, cls)(getattr(fastbert, cls.replace("Model", "Config"))(**config.to_dict())).eval()
    ids = torch.randint(5, 120, (3, 12), generator=torch.Generator().manual_seed(3))
    for mask in (torch.ones(3, 12, dtype=torch.long), torch.tensor([[1] * 12, [1] * 7 + [0] * 5, [1] * 2 + [0] * 10])):
        with_grad = model(ids, mask).last_hidden_state
        assert not calls
        with torch.no_grad():
            one_call = model(ids, mask).last_hidden_state
        assert len(calls) == 2
        calls.clear()
        assert torch.equal(one_call, with_grad.detach()), (one_call - with_grad).abs().max().item()


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("base", ["small", "biased"])
def test_modernbert_gives_the_same_bits_through_the_prenorm_route(backend, base, monkeypatch):
    """ModernBERT in inference runs each layer through prenorm_layer_forward (on Triton writing over
    what dies: the stream too, but the embeddings' output); grad mode on, the separate ops. Both must
    give the same bits, padded (no padding, and with the padded layout forced) and packed, every
    hidden state included, global and sliding layers, with and without biases."""
    require(backend)
    from fastbert.ops import encoder
    from tests.helpers import modernbert as mb

    calls = []  # the layers the route ran (it declines the torch backend: None)
    real = encoder.prenorm_layer_forward

    def spy(*args):
        out = real(*args)
        if out is not None:
            calls.append(1)
        return out

    monkeypatch.setattr(encoder, "prenorm_layer_forward", spy)
    _, model = mb.pair("ModernBertModel", mb.SMALL if base == "small" else mb.BIASED, seed=4, backend=backend,
                       num_hidden_layers=3)
    model.to(device_for(backend))
    g = torch.Generator().manual_seed(5)
    routed = 0 if backend == "torch" else 3
    for lengths, unpad in ((None, True), ((12, 7, 2), True), ((12, 7, 2), False)):
        ids, mask = (t.to(device_for(backend)) for t in mb.batch(3, 12, g, lengths))
        model.unpad_inputs = unpad
        with_grad = model(ids, mask, output_hidden_states=True)
        assert not calls
        with torch.no_grad():
            routed_out = model(ids, mask, output_hidden_states=True)
        assert len(calls) == routed, (lengths, unpad)
        for got, want in zip((routed_out.last_hidden_state, *routed_out.hidden_states),
                             (with_grad.last_hidden_state, *with_grad.hidden_states)):
            assert torch.equal(got, want.detach()), (lengths, unpad, (got - want).abs().max().item())
        with torch.no_grad():  # and without the hidden states asked for, where the stream is written over
            assert torch.equal(model(ids, mask).last_hidden_state, routed_out.last_hidden_state)
        calls.clear()


@pytest.mark.parametrize("path", ["addmm", "dot", "onednn", "onednn_packed", "mkl_packed"])
def test_one_cpp_call_gives_the_same_bits(path, monkeypatch):
    """Once its GEMM paths are known (measured, or forced), a layer on the C++ kernels runs as one call
    of the extension (csrc/encoder_layer.cpp), bit for bit what the kernels called one by one from
    Python give, padded and packed, with the relative bias; a path that call does not run keeps the
    layer in Python."""
    from fastbert.backend import cpp_function
    from fastbert.ops import gemm

    require("cpp")
    assert cpp_function("encoder_layer_forward") is not None, "the built extension predates encoder_layer_forward"
    if path not in gemm.candidates("fwd", torch.float32):
        pytest.skip(f"the fp32 GEMM path {path} is not used here: {gemm.unavailable().get((path, 'fwd', torch.float32))}")
    from fastbert.ops import encoder as module

    runs = dict(module.FLOAT_LAYER_PATHS)
    assert path in runs
    calls = []
    real = cpp_function("encoder_layer_forward")
    monkeypatch.setattr(fastbert.backend, "cpp_function",
                        lambda name: (lambda *a, **k: calls.append(1) or real(*a, **k))
                        if name == "encoder_layer_forward" else cpp_function(name))
    g = torch.Generator().manual_seed(5)
    hidden, heads, ffn = 64, 4, 96
    w = weights(hidden, ffn, g)
    x = torch.randn(3, 11, hidden, generator=g)
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, 7:] = False
    rel = layouts.relative_bias(torch.randn(32, heads, generator=g), 11)
    xp, cu, n = packed_case([5, 11, 1], hidden, g)
    cases = [(x, dict()), (x, dict(attention_mask=mask, relative_bias=rel)),
             (xp, dict(cu_seqlens=cu, max_seqlen=n)), (xp, dict(cu_seqlens=cu, max_seqlen=n, relative_bias=rel))]
    with torch.no_grad(), gemm.forced(path):
        for rows, kw in cases:
            calls.clear()
            got = encoder_layer(rows, w, heads=heads, eps=(1e-12, 1e-5), backend="cpp", **kw)
            assert calls == [1], kw
            monkeypatch.setattr(module, "FLOAT_LAYER_PATHS", {})  # no path it runs: the kernels one by one
            want = encoder_layer(rows, w, heads=heads, eps=(1e-12, 1e-5), backend="cpp", **kw)
            monkeypatch.setattr(module, "FLOAT_LAYER_PATHS", runs)
            assert calls == [1] and torch.equal(got, want), (path, sorted(kw))
        monkeypatch.setattr(module, "FLOAT_LAYER_PATHS", {p: i for p, i in runs.items() if p != path})
        calls.clear()
        encoder_layer(x, w, heads=heads, eps=(1e-12, 1e-5), backend="cpp")
        assert calls == []


def test_the_gemm_path_ids_are_the_extensions():
    """fastbert.ops.encoder.GEMM_PATH_IDS, the one table of the GEMM paths the extension's layers
    run, is the extension's own (its GemmPath enum, as gemm_path_ids() lists it): the same names and
    ids, the int8 ones INT8_PATHS; and each is a path fastbert.ops.gemm knows."""
    from fastbert.backend import cpp_function
    from fastbert.ops import encoder, gemm

    require("cpp")
    listed = cpp_function("gemm_path_ids")
    assert listed is not None, "the built extension predates gemm_path_ids"
    table = listed()
    assert {name: i for name, i, _ in table} == encoder.GEMM_PATH_IDS
    assert {name for name, _, int8 in table if int8} == set(encoder.INT8_PATHS)
    assert set(encoder.FLOAT_LAYER_PATHS) | set(encoder.INT8_LAYER_PATHS) == set(encoder.GEMM_PATH_IDS)
    assert set(encoder.GEMM_PATH_IDS) - {"packed"} <= set(gemm.PATHS)  # "packed": the weight's layout, not a choice
