"""A post-LN layer's training step as one autograd node (fastbert.ops.layer_training, the Triton
route BertLayer takes with a gradient to come) against the separate ops the layer ran before (the
same kernels, each op's own autograd node, held to the reference by the op tests): the output and
every gradient, packed and padded, with dropout, the tanh GELU, MPNet's relative bias, DistilBERT's
names, frozen weights, and a step repeated after the parameters moved."""
import copy

import pytest
import torch

import fastbert
from fastbert.ops import layer_training
from tests.helpers.backends import device_for, require

pytestmark = pytest.mark.triton

CFG = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
           max_position_embeddings=64)


@pytest.fixture(autouse=True)
def _triton():
    require("triton")


@pytest.fixture
def node_calls(monkeypatch):
    """How many layers ran as the node (a list whose length counts them)."""
    calls = []
    real = layer_training.layer_training_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(layer_training, "layer_training_forward", counted)
    return calls


def _separate_ops(monkeypatch):
    monkeypatch.setattr(layer_training, "applies", lambda *args: False)


def _ids(pad: bool, bsz=3, seq=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 97, (bsz, seq), generator=g)
    mask = torch.ones_like(ids)
    if pad:
        mask[1, 7:] = 0
        mask[2, 3:] = 0
    return ids.to(device_for("triton")), mask.to(device_for("triton"))


def _step(model, ids, mask, seed=3):
    """One training step's output and every gradient (a fixed linear loss of the last hidden state)."""
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = torch.linspace(-1, 1, out.shape[-1], device=out.device)
    (out.float() * weights).sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters()}


def _compare(got, want, rtol=1e-5, atol=1e-6):
    (out, grads), (out_w, grads_w) = got, want
    torch.testing.assert_close(out, out_w, rtol=rtol, atol=atol)
    assert grads.keys() == grads_w.keys()
    for name in grads:
        if grads_w[name] is None:
            assert grads[name] is None, f"{name}: a gradient the separate ops do not give"
            continue
        torch.testing.assert_close(grads[name], grads_w[name], rtol=rtol, atol=atol, msg=name)


def _bert(**overrides):
    torch.manual_seed(0)
    model = fastbert.BertModel(fastbert.BertConfig(**dict(CFG, **overrides)), add_pooling_layer=False)
    return model.train().to(device_for("triton")).set_backend("triton")


@pytest.mark.parametrize("pad", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_the_node_is_the_separate_ops(monkeypatch, node_calls, pad, act):
    model = _bert(hidden_act=act, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3)
    ids, mask = _ids(pad)
    got = _step(model, ids, mask)
    assert len(node_calls) == CFG["num_hidden_layers"], "the layers did not run as the node"
    _separate_ops(monkeypatch)
    want = _step(model, ids, mask)
    _compare(got, want)


def test_frozen_weights_get_no_gradient(monkeypatch, node_calls):
    model = _bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    layer = model.encoder.layer[0]
    for p in (layer.attention.self.key.weight, layer.intermediate.dense.weight, layer.output.dense.weight,
              layer.attention.output.dense.weight):
        p.requires_grad_(False)
    ids, mask = _ids(True)
    got = _step(model, ids, mask)
    assert node_calls
    _separate_ops(monkeypatch)
    _compare(got, _step(model, ids, mask))


def test_steps_after_the_parameters_moved(monkeypatch, node_calls):
    # an optimizer writes in place; .to() and load_state_dict give new memory: each step reads the
    # parameters as they are (the joined QKV tensor rejoined where a part moved)
    model = _bert(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    reference = copy.deepcopy(model)
    ids, mask = _ids(True)
    for change in ("adamw", "state_dict", "to"):
        for m in (model, reference):
            if change == "adamw":
                _step(m, ids, mask)
                opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
                opt.step()
            elif change == "state_dict":
                m.load_state_dict({k: v + 0.01 for k, v in m.state_dict().items()})
            else:
                m.to(torch.float64).to(torch.float32)
        got = _step(model, ids, mask)
        with monkeypatch.context() as mp:
            _separate_ops(mp)
            want = _step(reference, ids, mask)
        _compare(got, want)


def test_mpnet_relative_bias_and_distilbert_names(monkeypatch, node_calls):
    transformers = pytest.importorskip("transformers")
    from tests.helpers.families import pair

    torch.manual_seed(0)
    hc = transformers.MPNetConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=66)
    mpnet = fastbert.MPNetModel(fastbert.MPNetConfig(**hc.to_dict()), add_pooling_layer=False)
    _, distil = pair("distilbert", "DistilBertModel")
    for model in (mpnet, distil):
        model.train().to(device_for("triton")).set_backend("triton")
        node_calls.clear()
        ids, mask = _ids(True)
        got = _step(model, ids, mask)
        assert len(node_calls) == 2, type(model).__name__
        with monkeypatch.context() as mp:
            _separate_ops(mp)
            want = _step(model, ids, mask)
        _compare(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a GPU's: needs CUDA")
def test_a_training_layer_never_waits_for_the_gpu():
    # the model's input checks read its inputs once per forward; a layer, forward and backward, never
    model = _bert(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    layer = model.encoder.layer[0]
    ids, mask = _ids(True)
    hidden = torch.randn(int(mask.sum()), CFG["hidden_size"], device="cuda", requires_grad=True)
    lengths = mask.sum(1).to(torch.int32)
    cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    packed = (cu, int(lengths.max()))
    layer(hidden, None, packed)  # compiles the kernels outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, _ = layer(hidden, None, packed)
        out.float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("options", ["plain", "biased"])
@pytest.mark.parametrize("pad", [True, False], ids=["packed", "padded"])
def test_the_prenorm_node_is_the_separate_ops(monkeypatch, pad, options):
    # ModernBERT's layers: layer 0 (no attention norm), global and sliding ones, with and without biases
    pytest.importorskip("transformers")
    from tests.helpers.modernbert import BIASED, SMALL, randomize

    calls = []
    real = layer_training.prenorm_training_forward
    monkeypatch.setattr(layer_training, "prenorm_training_forward",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = dict(SMALL if options == "plain" else BIASED, local_attention=4)
    model = fastbert.ModernBertModel(fastbert.ModernBertConfig(**cfg))
    randomize(model, 0)
    model.train().to(device_for("triton")).set_backend("triton")
    ids, mask = _ids(pad, seq=12)
    got = _step(model, ids, mask)
    assert len(calls) == cfg["num_hidden_layers"], "the layers did not run as the node"
    with monkeypatch.context() as mp:
        _separate_ops(mp)
        want = _step(model, ids, mask)
    _compare(got, want, rtol=1e-5, atol=1e-5)


def test_the_node_in_half_precision(monkeypatch, node_calls):
    # a model in fp16 (no autocast): the node's GEMMs and kernels in fp16, as the separate ops run them
    model = _bert(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1).half()
    ids, mask = _ids(True)
    got = _step(model, ids, mask)
    assert node_calls
    _separate_ops(monkeypatch)
    (out, grads), (out_w, grads_w) = got, _step(model, ids, mask)
    # the same kernels; the sums of the residual gradients round in another order (fp16: about one
    # unit in the last place of a tensor's largest value; a gradient that is 0 in exact arithmetic,
    # the key bias's, is rounding noise on either side: measured against a floor)
    for name, a, b in [("output", out, out_w)] + [(n, grads[n], grads_w[n]) for n in grads]:
        scale = max(b.float().abs().max().item(), 1e-2)
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 4e-3 * scale, f"{name}: {err:.3g} against {scale:.3g}"


def test_the_launchers_write_into_given_memory_what_they_would_allocate():
    # the step hands the kernels memory from one allocation (kernels.empty_parts): the same bits as
    # the launchers' own outputs, and memory of the wrong shape refused with a one-line error
    from fastbert import backend as fb_backend
    from fastbert.kernels import empty_parts

    ln, gelu, geglu = (fb_backend.impl("triton", op) for op in ("layer_norm", "bias_gelu", "geglu"))
    dev = device_for("triton")
    g = torch.Generator().manual_seed(0)
    M, N, F = 37, 64, 96
    x, r, dy = (torch.randn(M, N, generator=g).to(dev) for _ in range(3))
    w, b = torch.randn(N, generator=g).to(dev), torch.randn(N, generator=g).to(dev)
    u, du, fb = torch.randn(M, F, generator=g).to(dev), torch.randn(M, F, generator=g).to(dev), torch.randn(F).to(dev)
    stats = ((M,), torch.float32)
    y, mean, rstd, dx, dres, partials, di, gelu_partials, gg, dgg = empty_parts(
        [((M, N), x.dtype), stats, stats, ((M, N), x.dtype), ((M, N), x.dtype),
         (ln.backward_partials_shape(M, N, dev), torch.float32), ((M, F), x.dtype),
         (gelu.backward_partials_shape(M, F, dev), torch.float32), ((M, F // 2), x.dtype), ((M, F), x.dtype)], dev)
    own = ln.add_layer_norm_forward(x, r, w, b, 1e-5, 0.0, None)
    given = ln.add_layer_norm_forward(x, r, w, b, 1e-5, 0.0, None, out=y, stats_out=(mean, rstd))
    assert given[0] is y and all(torch.equal(a, c) for a, c in zip(own, given))
    own = ln.add_layer_norm_backward(dy, x, r, w, mean, rstd, 0.0, None)
    given = ln.add_layer_norm_backward(dy, x, r, w, mean, rstd, 0.0, None, out=(dx, dres), partials=partials)
    assert given[0] is dx and given[1] is dres and all(torch.equal(a, c) for a, c in zip(own, given))
    own = gelu.bias_gelu_backward(du, u, fb, "none")
    given = gelu.bias_gelu_backward(du, u, fb, "none", out=di, partials=gelu_partials)
    assert given[0] is di and all(torch.equal(a, c) for a, c in zip(own, given))
    assert torch.equal(geglu.geglu_forward(u, "tanh", out=gg), geglu.geglu_forward(u, "tanh"))
    dh = torch.randn(M, F // 2, generator=g).to(dev)
    assert torch.equal(geglu.geglu_backward(dh, u, "tanh", out=dgg), geglu.geglu_backward(dh, u, "tanh"))
    with pytest.raises(ValueError, match="partials must be fp32"):
        ln.add_layer_norm_backward(dy, x, r, w, mean, rstd, 0.0, None, partials=partials[:, :1])
    with pytest.raises(ValueError, match="partials must be fp32"):
        gelu.bias_gelu_backward(du, u, fb, "none", partials=gelu_partials[:1])
