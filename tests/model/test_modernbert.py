"""ModernBERT on fastbert against transformers' own ModernBERT classes, fp32: every output at real
tokens, the losses and every parameter's gradient, with seeded random weights (every tensor drawn
afresh, the LayerNorm weights and the biases too, so that none of them can be skipped unnoticed) on
a small config whose global and sliding layers alternate and whose window (local_attention 8:
keys at most 4 positions away) matters at 30 tokens; batches with and without padding; the packed
and the padded paths; output_attentions; checkpoints both ways; the Auto classes; ModernBERT-base's
shape; bf16 (a bf16 model, autocast); torch.compile; what is not supported, each a clear error (int8:
test_modernbert_int8.py)."""
import copy
import json

import pytest
import torch

import fastbert
from tests.helpers.backends import require
from tests.helpers.bounds import assert_within_bound
from tests.helpers.modernbert import (
    BIASED,
    LENGTHS,
    REL,
    SMALL,
    assert_checkpoints_both_ways,
    assert_full_size_matches,
    assert_paths_agree,
    batch,
    check_close,
    inputs,
    outputs_and_grads,
    pair,
    parity,
    randomize,
)

transformers = pytest.importorskip("transformers")

MAIN = {"ModernBertModel": "last_hidden_state", "ModernBertForMaskedLM": "logits",
        "ModernBertForSequenceClassification": "logits", "ModernBertForTokenClassification": "logits"}
# tiny models: one thread runs them as fast as two, and far faster when the cores are shared
pytestmark = pytest.mark.usefixtures("one_thread")


CASES = [("ModernBertModel", {}), ("ModernBertForMaskedLM", {}),
         ("ModernBertForSequenceClassification", dict(classifier_pooling="cls")),
         ("ModernBertForSequenceClassification", dict(classifier_pooling="mean")),
         ("ModernBertForTokenClassification", {})]


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n[10:] or 'Model'}-{kw.get('classifier_pooling', '')}"
                                                 for n, kw in CASES])
@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_matches_transformers(backend_name, name, kw, padded):
    require(backend_name)
    hm, fm = pair(name, backend=backend_name, **kw)
    ids, mask, labels = inputs(name, 1, LENGTHS if padded else None)
    errors = parity(hm, fm, ids, mask, labels)
    assert any("layers.3.mlp.Wo" in k for k in errors) and (name == "ModernBertModel" or "loss" in errors)


@pytest.mark.parametrize("name", ["ModernBertForMaskedLM", "ModernBertForSequenceClassification"])
def test_every_option_matches_transformers(name):
    """Biases everywhere, another GELU, an untied decoder, other rope thetas and layer pattern, mean pooling."""
    require("cpp")
    hm, fm = pair(name, BIASED, backend="cpp", classifier_pooling="mean")
    assert fm.config.layer_types == hm.config.layer_types == ["full_attention", "sliding_attention"] * 2
    assert fm.config.rope_parameters["sliding_attention"]["rope_theta"] == 500.0
    if name == "ModernBertForMaskedLM":
        assert fm.decoder.bias is None and fm.decoder.weight is not fm.model.embeddings.tok_embeddings.weight
    parity(hm, fm, *inputs(name, 2))


def test_question_answering_matches_transformers():
    """Its loss softmaxes over padded positions too: checked on a batch without padding."""
    require("cpp")
    name = "ModernBertForQuestionAnswering"
    parity(*pair(name, backend="cpp"), *inputs(name, 3, None))


def test_hidden_states_inputs_embeds_and_sparse_prediction_match_transformers():
    require("cpp")
    hm, fm = pair("ModernBertForMaskedLM", backend="cpp", sparse_prediction=True)
    ids, mask, extra = inputs("ModernBertForMaskedLM", 4)
    errors = parity(hm, fm, ids, mask, extra, output_hidden_states=True)
    assert len([k for k in errors if k.startswith("hidden_states")]) == SMALL["num_hidden_layers"] + 1
    picked = int((extra["labels"] != -100).sum())
    assert fm(input_ids=ids, attention_mask=mask, **extra).logits.shape == (picked, SMALL["vocab_size"])
    # inputs_embeds in place of input_ids (normed as the word embeddings are)
    embeds = torch.randn(4, 30, SMALL["hidden_size"], generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, want = (m.model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state[mask.bool()] for m in (fm, hm))
    check_close(errors, "inputs_embeds", got, want)


@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_packed_and_padded_paths_agree(backend_name):
    """The packed path (a batch with padding, by default) and the padded one (unpad_inputs=False:
    attention over the padded layout with the mask, window and rotary inside) both match
    transformers, and each other, left padding too (rotary positions: within each sequence packed,
    the row index padded, as transformers counts them; the scores depend only on the distance)."""
    require(backend_name)
    hm, fm = pair("ModernBertForTokenClassification", backend=backend_name)
    for left in (False, True):
        assert_paths_agree(hm, fm, fm.model, *inputs("ModernBertForTokenClassification", 6, left=left), parity)


def test_the_window_and_the_rotary_bases_matter():
    """The parity above can fail: at this size, attention without the window, or with the rotary
    bases swapped, is far from transformers' values."""
    hm, fm = pair("ModernBertModel")
    ids, mask, _ = inputs("ModernBertModel", 7)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    sliding = [layer.attn for layer in fm.layers if layer.attention_type == "sliding_attention"]
    assert sliding and all(a.window == 4 for a in sliding)
    for change in ("window", "rope_theta"):
        for a in sliding:
            setattr(a, change, None if change == "window" else 160000.0)
        with torch.no_grad():
            got = fm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        assert (got - want).abs().max() > 100 * REL * want.abs().max(), change  # 100 x what parity allows
        for a in sliding:
            setattr(a, change, 4 if change == "window" else 10000.0)
    with torch.no_grad():
        torch.testing.assert_close(fm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()], want,
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
                                  "ModernBertForTokenClassification", "ModernBertForQuestionAnswering"])
def test_checkpoints_both_ways(tmp_path, name):
    hm, _ = pair(name)
    inputs = batch(4, 30, torch.Generator().manual_seed(8), LENGTHS)
    saved = assert_checkpoints_both_ways(tmp_path, hm, name, inputs, MAIN.get(name, "start_logits"))
    assert saved["model_type"] == "modernbert"
    assert saved["layer_types"] == hm.config.layer_types and saved["local_attention"] == 8


def test_config_reads_what_transformers_reads(tmp_path):
    """transformers 5's config.json (layer_types, rope_parameters) and the earlier one of the hub's
    checkpoints (global_attn_every_n_layers, global_rope_theta, local_rope_theta) give the layer
    types, rotary bases and window transformers gives them."""
    hub = dict(SMALL, num_hidden_layers=5, global_attn_every_n_layers=2, global_rope_theta=1000.0,
               local_rope_theta=50.0, reference_compile=True, model_type="modernbert")
    for d in (transformers.ModernBertConfig(**SMALL).to_dict(), hub):
        (tmp_path / "config.json").write_text(json.dumps(d))
        theirs = transformers.AutoConfig.from_pretrained(str(tmp_path))
        ours = fastbert.AutoConfig.from_pretrained(str(tmp_path))
        assert isinstance(ours, fastbert.ModernBertConfig)
        assert ours.layer_types == theirs.layer_types
        assert ours.sliding_window == theirs.sliding_window == 4
        for t in ("full_attention", "sliding_attention"):
            assert ours.rope_theta(t) == theirs.rope_parameters[t]["rope_theta"]
    assert ours.layer_types == ["full_attention", "sliding_attention"] * 2 + ["full_attention"]
    with pytest.raises(ValueError, match="rope_type 'linear' .* is not supported"):
        fastbert.ModernBertConfig(rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="layer_types must name one of"):
        fastbert.ModernBertConfig(num_hidden_layers=2, layer_types=["full_attention"])
    with pytest.raises(ValueError, match="classifier_pooling must be 'cls' or 'mean'"):
        fastbert.ModernBertConfig(classifier_pooling="max")


def test_auto_classes_name_modernbert_among_the_supported(tmp_path):
    transformers.DebertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=48).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"model_type 'deberta' is not supported; supported: .*\bmodernbert\b"):
        fastbert.AutoModel.from_pretrained(str(tmp_path))
    config = fastbert.ModernBertConfig(**SMALL)
    assert type(fastbert.AutoModelForMaskedLM.from_config(config)) is fastbert.ModernBertForMaskedLM
    with pytest.raises(TypeError, match="ModernBertModel takes a fastbert.ModernBertConfig"):
        fastbert.ModernBertModel(fastbert.BertConfig())


def test_what_is_not_supported_is_a_clear_error():
    hm, fm = pair("ModernBertForMaskedLM")
    ids, _ = batch(2, 12, torch.Generator().manual_seed(9))
    for kwargs, what in ((dict(position_ids=torch.randperm(12)[None]), "position_ids.* not supported"),
                         (dict(attention_mask=torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()), "other than a padding"),
                         (dict(head_mask=torch.ones(4)), "no head_mask: transformers' ModernBertModel has none")):
        for model in (fm, fm.model):
            with pytest.raises(NotImplementedError, match=what):
                model(input_ids=ids, **kwargs)
    with torch.no_grad():  # position ids that count along each row (from any start) are what the kernels do
        shifted, want = (m(input_ids=ids, position_ids=torch.arange(3, 15)[None]).logits for m in (fm, hm))
    torch.testing.assert_close(shifted, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,padded", [("ModernBertModel", True), ("ModernBertForTokenClassification", False)])
def test_output_attentions_match_transformers_eager(name, padded):
    """Every layer's probabilities [batch, heads, seq, seq] against transformers' eager attention, every row
    (a padded query with no real key in its window spreads over every key, as there), the hidden states,
    every gradient (through the probabilities too); zeros outside the window."""
    require("cpp")
    hm, fm = pair(name, None if padded else BIASED, backend="cpp")
    ids, mask, labels = inputs(name, 15, LENGTHS if padded else None)
    errors = parity(hm, fm, ids, mask, labels, output_attentions=True, output_hidden_states=True)
    assert len([k for k in errors if k.startswith("attentions")]) == SMALL["num_hidden_layers"]
    probs = fm(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    far = (torch.arange(30)[:, None] - torch.arange(30)[None]).abs() > fm.config.sliding_window
    real = (mask[:, None, :, None] * mask[:, None, None, :]).bool().expand_as(probs[0])[..., far]
    for p, kind in zip(probs, fm.config.layer_types):  # a real query and key further apart than the window
        outside = p[..., far][real]
        assert (not outside.any()) if kind == "sliding_attention" else bool(outside.all()), kind


@pytest.mark.parametrize("mode", ["bf16 model", "autocast"])
def test_bf16_within_transformers_bound(mode):
    """A bf16 model, and the fp32 one under torch.autocast("cpu", bfloat16): outputs, loss, gradients;
    the error against transformers in float64 at most twice transformers' own in the same mode plus
    the bf16 floor (tests.helpers.bounds.assert_within_bound)."""
    require("cpp")
    name = "ModernBertForTokenClassification"
    hm, fm = pair(name, backend="cpp")
    ids, mask, labels = inputs(name, 14)
    exact = copy.deepcopy(hm).double()  # sdpa: eager softmaxes in fp32, where fp64's mask minimum is -inf (NaN rows)
    exact.set_attn_implementation("sdpa")
    ours, theirs, ref = (outputs_and_grads(m, ids, mask, labels, md) for m, md in ((fm, mode), (hm, mode), (exact, None)))
    for key in ref:  # (a key ours lacks: a KeyError)
        assert_within_bound(f"{mode} {key}", ours[key], theirs[key], ref[key].double(), torch.bfloat16)


def test_torch_compile_fullgraph_like_eager():
    """torch.compile(fullgraph=True: a graph break is an error) of a token classifier (a global and a
    sliding layer) on a padded batch: the outputs, loss and every gradient as eager gives them."""
    require("cpp")
    name = "ModernBertForTokenClassification"
    _, model = pair(name, backend="cpp", num_hidden_layers=2)
    ids, mask, labels = inputs(name, 16)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    eager, got = (outputs_and_grads(model, ids, mask, labels, fn=fn) for fn in (model, compiled))
    for key in eager:
        torch.testing.assert_close(got[key], eager[key], rtol=1e-4, atol=1e-5, msg=key)


def test_gradient_checkpointing_gives_the_same_gradients(monkeypatch):
    calls = []
    original = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or original(*a, **k))
    _, fm = pair("ModernBertForMaskedLM")
    ids, mask, labels = inputs("ModernBertForMaskedLM", 10)
    plain = outputs_and_grads(fm.train(), ids, mask, labels)
    fm.gradient_checkpointing_enable()
    again = outputs_and_grads(fm, ids, mask, labels)
    for n in plain:
        torch.testing.assert_close(again[n], plain[n], rtol=1e-5, atol=1e-7, msg=n)
    assert len(calls) == SMALL["num_hidden_layers"]  # each layer's activations recomputed, once


@pytest.mark.slow
def test_modernbert_base_shape_matches_transformers():
    """ModernBERT-base's configuration (transformers' defaults: hidden 768, 12 heads, 22 layers,
    vocab 50368, local_attention 128, rotary bases 160000 / 10000) with random weights, on a batch
    longer than the window (160 tokens): last_hidden_state at real tokens."""
    require("cpp")
    from transformers.initialization import no_init_weights

    hc = transformers.ModernBertConfig(attn_implementation="sdpa")
    assert (hc.hidden_size, hc.num_hidden_layers, hc.local_attention, hc.vocab_size) == (768, 22, 128, 50368)
    with no_init_weights():  # every weight is drawn below
        hm = transformers.ModernBertModel(hc).eval()
    randomize(hm, 11, scale=0.02)
    assert_full_size_matches(hm, parity, 160, 100)


def test_patch_runs_a_transformers_modernbert_on_fastbert():
    """fastbert.patch: transformers' model runs on fastbert, on its own Parameter objects."""
    hm, _ = pair("ModernBertForSequenceClassification", classifier_pooling="mean")
    ids, mask, _ = inputs("ModernBertForSequenceClassification", 13)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).logits
        fastbert.patch(hm)
        got = hm(input_ids=ids, attention_mask=mask).logits
    assert isinstance(hm.fastbert_model, fastbert.ModernBertForSequenceClassification)
    assert hm.fastbert_model.classifier.weight is hm.classifier.weight
    check_close({}, "patched logits", got, want)
