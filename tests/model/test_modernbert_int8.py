"""ModernBERT's int8 inference (quantize="int8", ModernBertModel._int8_layer): close to the same
model in fp32; every layer exactly the int8 rule (its GEMMs' inputs quantized per row, its weights per
channel, everything else in float), checked layer by layer against the fp32 layer with the rule
applied by hand; the never-stale guarantees; checkpoints transformers loads; bf16; the padded and
explicit paths; and the errors for training. Small random models (tests.helpers.modernbert's), biases off
(ModernBERT's default) and on."""
import copy

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert import layouts
from fastbert.model.quantize import Int8Linear
from fastbert.ops import encoder
from fastbert.reference import int8 as rule
from tests.helpers.modernbert import BIASED, SMALL, inputs, pair
from tests.helpers.profiles import fastbert_op_counts

transformers = pytest.importorskip("transformers")
# tiny models: one thread runs them as fast as two, and far faster when the cores are shared
pytestmark = pytest.mark.usefixtures("one_thread")
CLASSIFIER = "ModernBertForSequenceClassification"
# int8 against fp32: max abs error relative to fp32's largest value, and the cosine of the two as flat
# vectors (measured: 0.012 to 0.015 and 0.9999 with weights in [-127, 127], 0.022 to 0.024 and 0.9997 in [-64, 64])
MAX_ERR = 0.05
MIN_COS = 0.999


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / a.norm() / b.norm())


def assert_close_to_fp32(tag, got, want):
    err, cos = (got.double() - want.double()).abs().max().item(), cosine(got, want)
    assert err <= MAX_ERR * want.abs().max().item() and cos >= MIN_COS, f"{tag}: max abs error {err:.3e}, cosine {cos:.5f}"


def quantized(model, weight_range=None):
    """An int8 copy of model (fastbert's), every encoder linear layer an Int8Linear."""
    q = copy.deepcopy(model).quantize_("int8", weight_range=weight_range)
    assert sum(isinstance(m, Int8Linear) for m in q.modules()) == 4 * model.config.num_hidden_layers
    assert q.quantized == "int8" and q.base_model.quantized == "int8" and not q.training
    return q


@pytest.mark.parametrize("weight_range", [127, 64])
@pytest.mark.parametrize("biased", [False, True], ids=["no-bias", "biased"])
def test_int8_close_to_fp32(biased, weight_range):
    """A padded batch (packed path): last_hidden_state at real tokens and the classifier's logits.
    Wrong scales or offsets fail here; a layer left in float would pass (the next test catches it)."""
    _, fm = pair(CLASSIFIER, BIASED if biased else None, backend="cpp")
    ids, mask, _ = inputs(CLASSIFIER, 1)
    q = quantized(fm, weight_range)
    with torch.no_grad():
        want, got = (m(ids, mask, output_hidden_states=True) for m in (fm, q))
        counts = fastbert_op_counts(lambda: q(ids, mask))
    real = mask.bool()
    assert_close_to_fp32("last_hidden_state", got.hidden_states[-1][real], want.hidden_states[-1][real])
    assert_close_to_fp32("logits", got.logits, want.logits)
    # GeGLU in one pass: the gate and up products' dequantization, the gate and its quantization
    assert counts["int8_glu"] + counts["int8_packed_glu"] == fm.config.num_hidden_layers, counts  # packed: with the product


def fake_quant_linear(x, weight, bias=None, **_):
    """F.linear of x's rows quantized and dequantized by the int8 rule (fastbert.reference.int8)."""
    q, s, o = rule.quantize_rows(x.reshape(-1, x.shape[-1]))
    rows = (q[:-1].float() * s[:, None] + o[:, None]).to(x.dtype)
    return F.linear(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])


def layer_errors(int8, fp32, ids, mask, monkeypatch, rule_applied=True):
    """Each int8 layer's output against the fp32 layer's on the int8 model's own input to it (its
    hidden states), the fp32 weights quantized and dequantized by the rule (in the int8 layer's range)
    and every GEMM input fake-quantized (rule_applied=False: the plain fp32 layer): per layer, (median,
    max) over the real tokens of each token's largest error, relative to the output's largest value.
    Float rounding can flip a rounding tie of one element of a row, which moves that token by a step,
    and the tokens that attend to it (in a sliding layer, the 9 in its window) a little: the median
    stays clear of it."""
    with torch.no_grad():
        states = int8(ids, mask, output_hidden_states=True).hidden_states
        emu = copy.deepcopy(fp32.base_model)
        for layer, qlayer in zip(emu.layers, int8.base_model.layers):
            for (owner, name), (qowner, qname) in zip(layer.linear_slots(), qlayer.linear_slots()):
                w, s = layouts.quantize_weight(getattr(owner, name).weight, getattr(qowner, qname).weight_range)
                getattr(owner, name).weight.copy_(w.float() * s[:, None])
    errors, real = [], mask.bool()
    with monkeypatch.context() as patch, torch.no_grad():
        # the emulation replaces fastbert.ops.linear, which the separate ops call: the layers run
        # those (the inference route, fastbert.ops.encoder's, calls its GEMMs directly)
        patch.setattr(encoder, "prenorm_layer_forward", lambda *args: None)
        if rule_applied:
            patch.setattr(fastbert.ops, "linear", fake_quant_linear)
        for i, layer in enumerate(emu.layers):
            h, delta, _ = layer(states[i], None, mask, None)
            want = h + delta if i + 1 < len(emu.layers) else emu.apply_final_norm(h, delta)
            err = (states[i + 1] - want).abs().amax(-1)[real] / want[real].abs().max()
            errors.append((err.median().item(), err.max().item()))
    return errors


@pytest.mark.parametrize("backend_name", ["cpp", "torch"])
@pytest.mark.parametrize("biased", [False, True], ids=["no-bias", "biased"])
def test_every_layer_follows_the_int8_rule(biased, backend_name, monkeypatch):
    """At half the tokens or more every layer agrees with the rule to 1e-5 of its output (measured:
    2e-7), the rounding flips below 1e-2 (measured: 7e-3); a layer run in float misses by 1e-3 and
    more (measured: 3e-3 to 5e-3, every layer), and one with a weight scale 1% off by 1e-4 and more."""
    _, fm = pair(CLASSIFIER, BIASED if biased else None, backend=backend_name)
    ids, mask, _ = inputs(CLASSIFIER, 2)
    q = quantized(fm)
    for i, (median, worst) in enumerate(layer_errors(q, fm, ids, mask, monkeypatch)):
        assert median <= 1e-5 and worst <= 1e-2, f"layer {i}: median {median:.2e}, max {worst:.2e}"
    for i, (median, _) in enumerate(layer_errors(q, fm, ids, mask, monkeypatch, rule_applied=False)):
        assert median >= 1e-3, f"layer {i}: a float layer within {median:.2e} of the rule: the check cannot fail"
    q.base_model.layers[1].mlp.Wi.weight_scale.mul_(1.01)
    median = layer_errors(q, fm, ids, mask, monkeypatch)[1][0]
    assert median >= 1e-4, f"a weight scale 1% off moves layer 1 by {median:.2e} only"


def test_weights_are_never_stale():
    """A write through .data into any layer's int8 weight is what the next forward multiplies by;
    load_state_dict of float weights quantizes them in place; to() keeps the scales fp32."""
    _, fm = pair("ModernBertModel", backend="cpp")
    q = quantized(fm)
    ids, mask, _ = inputs("ModernBertModel", 3)
    real = mask.bool()

    def out(model=q):
        with torch.no_grad():
            return model(ids, mask).last_hidden_state[real].clone()

    before = out()
    for i, layer in enumerate(q.layers):
        for owner, name in layer.linear_slots():
            weight = getattr(owner, name).weight
            weight.data[:, : weight.shape[1] // 2].mul_(-1)
            assert not torch.allclose(out(), before, atol=1e-3), f"layer {i} {name}: the write had no effect"
            weight.data[:, : weight.shape[1] // 2].mul_(-1)
    torch.testing.assert_close(out(), before, rtol=0, atol=0)
    other, _ = pair("ModernBertModel", seed=1)
    q.load_state_dict(other.state_dict())
    fresh = fastbert.ModernBertModel(q.config).eval()
    fresh.load_state_dict(other.state_dict())
    torch.testing.assert_close(out(), out(fresh.quantize_("int8")), rtol=0, atol=0)
    q.to(torch.float64).to(torch.float32)
    assert all(m.weight_scale.dtype == torch.float32 and m.weight.dtype == torch.int8
               for m in q.modules() if isinstance(m, Int8Linear))
    torch.testing.assert_close(out(), out(fresh), rtol=0, atol=0)


@pytest.mark.parametrize("name", [CLASSIFIER, "ModernBertForMaskedLM"])
def test_checkpoints_are_transformers(tmp_path, name):
    """from_pretrained(quantize="int8") of transformers' checkpoint: transformers' state-dict names,
    the dequantized weights within a step of the float ones (the rest exact); save_pretrained writes
    what transformers loads (nothing missing or left over) and runs close to fp32; loading that again
    quantizes to the same int8 weights."""
    hm, fm = pair(name)
    hm.save_pretrained(tmp_path / "hf")
    torch.manual_seed(0)
    model = getattr(fastbert, name).from_pretrained(str(tmp_path / "hf"), quantize="int8")
    assert model.quantized == "int8" and not model.training
    want = fm.state_dict()
    assert list(model.state_dict()) == list(want)
    for key, value in model.state_dict().items():
        assert value.dtype == torch.float32, key
        torch.testing.assert_close(value, want[key], atol=float(want[key].abs().max()) / 64, rtol=0, msg=key)
        assert torch.equal(value, want[key]) or ".Wqkv." in key or ".Wo." in key or ".Wi." in key, key
    model.save_pretrained(str(tmp_path / "int8"))
    back, info = getattr(transformers, name).from_pretrained(str(tmp_path / "int8"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    again = getattr(fastbert, name).from_pretrained(str(tmp_path / "int8"), quantize="int8")
    for a, b in zip(model.modules(), again.modules()):
        if isinstance(a, Int8Linear):
            assert torch.equal(a.weight, b.weight) and torch.equal(a.weight_scale, b.weight_scale)
    ids, mask, _ = inputs(name, 4)
    with torch.no_grad():
        got, ref = (m(input_ids=ids, attention_mask=mask).logits for m in (back.eval(), hm))
    if got.dim() == 3:
        got, ref = got[mask.bool()], ref[mask.bool()]
    assert_close_to_fp32("transformers on the saved int8 checkpoint", got, ref)


def test_bf16_model_runs_int8(tmp_path):
    """from_pretrained(dtype=bfloat16, quantize="int8"): bf16 between the int8 GEMMs, close to fp32;
    its state dict in bf16 (the float weights' dtype, for layers without a bias too)."""
    hm, fm = pair(CLASSIFIER)
    hm.save_pretrained(tmp_path)
    model = fastbert.ModernBertForSequenceClassification.from_pretrained(str(tmp_path), dtype=torch.bfloat16,
                                                                          quantize="int8")
    assert {v.dtype for v in model.state_dict().values()} == {torch.bfloat16}
    ids, mask, _ = inputs(CLASSIFIER, 5)
    with torch.no_grad():
        got, want = (m(ids, mask, output_hidden_states=True) for m in (model, fm))
    real = mask.bool()
    assert got.hidden_states[-1].dtype == torch.bfloat16
    assert_close_to_fp32("bf16 last_hidden_state", got.hidden_states[-1][real], want.hidden_states[-1][real])
    assert_close_to_fp32("bf16 logits", got.logits, want.logits)


def test_padded_path_attentions_and_hidden_states():
    """unpad_inputs=False (padded rows) and output_attentions (the explicit attention) agree with the
    packed path; the probabilities and hidden states are close to fp32's."""
    _, fm = pair(CLASSIFIER, backend="cpp")
    q = quantized(fm)
    ids, mask, _ = inputs(CLASSIFIER, 6)
    real = mask.bool()
    with torch.no_grad():
        packed = q(ids, mask, output_hidden_states=True)
        want = fm(ids, mask, output_attentions=True, output_hidden_states=True)
        q.model.unpad_inputs = False
        padded = q(ids, mask)
        q.model.unpad_inputs = True
        explicit = q(ids, mask, output_attentions=True, output_hidden_states=True)
    for got in (padded, explicit):
        torch.testing.assert_close(got.logits, packed.logits, atol=1e-2 * float(packed.logits.abs().max()), rtol=0)
    layers = SMALL["num_hidden_layers"]
    assert len(packed.hidden_states) == len(explicit.hidden_states) == layers + 1 and len(explicit.attentions) == layers
    for got, ref in zip(explicit.attentions, want.attentions):
        assert got.shape == ref.shape == (4, SMALL["num_attention_heads"], 30, 30)
        assert (got - ref).abs().max() <= 0.05
    for got, ref in zip(packed.hidden_states[1:], want.hidden_states[1:]):
        assert_close_to_fp32("hidden state", got[real], ref[real])


def test_training_and_backward_are_clear_errors():
    _, fm = pair(CLASSIFIER, backend="cpp")
    q = quantized(fm)
    ids, mask, labels = inputs(CLASSIFIER, 7)
    out = q(ids, mask, labels=labels["labels"])  # grad mode in eval: inference works, the backward does not
    with pytest.raises(RuntimeError, match="quantized to int8 for inference.*load it without quantize=") as e:
        out.loss.backward()
    assert "\n" not in str(e.value)
    q.train()
    with pytest.raises(RuntimeError, match="load it without quantize="):
        q(ids, mask)
