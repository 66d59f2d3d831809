"""MPNet on fastbert against transformers' own MPNet classes, fp32: every output at real tokens (the
pooler's too), the losses and every parameter's gradient (the shared relative position bias table
included), with seeded random weights (every tensor drawn afresh, the bias table wide enough that
it matters) on a small config; batches with and without padding, on the cpp and torch backends; the
packed and the padded paths; the explicit path (attention probabilities), the first-token shortcut
of the sequence classifier and int8, each with the bias; checkpoints both ways; the Auto classes;
all-mpnet-base-v2's shape."""

import pytest
import torch

import fastbert
from tests.helpers.backends import require
from tests.helpers.modernbert import (
    FLOOR,
    REL,
    assert_checkpoints_both_ways,
    assert_full_size_matches,
    assert_paths_agree,
    check_close,
    labels_for,
)
from tests.helpers.modernbert import parity as shared_parity

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=100, hidden_size=64, num_attention_heads=4, num_hidden_layers=3, intermediate_size=96,
             relative_attention_num_buckets=32, max_position_embeddings=66)
BOS, PAD, EOS = 0, 1, 2  # MPNet's <s>, <pad>, </s>
LENGTHS = (30, 17, 26, 5)  # right padding, mixed lengths (the first row full)
NAMES = ["MPNetModel", "MPNetForMaskedLM", "MPNetForSequenceClassification", "MPNetForTokenClassification",
         "MPNetForQuestionAnswering"]
MAIN = {"MPNetModel": "last_hidden_state", "MPNetForQuestionAnswering": "start_logits"}
# tiny models: one thread runs them as fast as two, and far faster when the cores are shared
pytestmark = pytest.mark.usefixtures("one_thread")


def randomize(model, seed, scale=0.1):
    """Every parameter drawn afresh: LayerNorm weights 1 + N(0, scale), the relative position bias
    table N(0, 1) (so that it moves the scores), the rest N(0, scale)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "relative_attention_bias" in name:
                p.copy_(noise)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + scale * noise)
            else:
                p.copy_(scale * noise)


def hf_config(**kw):
    return transformers.MPNetConfig(**dict(SMALL, **kw), attn_implementation="eager")


def pair(name, seed=0, **kw):
    """(transformers' model, fastbert's) with the same random weights, loaded strictly (every key)."""
    torch.manual_seed(seed)
    hm = getattr(transformers, name)(hf_config(num_labels=2 if name.endswith("QuestionAnswering") else 3, **kw)).eval()
    randomize(hm, seed)
    cls = getattr(fastbert, name)
    fm = cls(cls.config_class(**hm.config.to_dict())).eval()
    fm.load_state_dict(hm.state_dict(), strict=True)
    return hm, fm


def batch(bsz, seq, g, lengths=None):
    """(input_ids: <s> ... </s> then <pad>, attention_mask), right-padded to `lengths`."""
    lengths = lengths or (seq,) * bsz
    ids = torch.randint(3, SMALL["vocab_size"], (bsz, seq), generator=g)
    mask = torch.zeros(bsz, seq, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, 0], ids[b, n - 1] = BOS, EOS
    return ids.masked_fill(mask == 0, PAD), mask


def key_bias_check(errors, pname, p, theirs):
    """The key projection's bias has no gradient in exact arithmetic (it adds the same amount to every
    score of a query, which the softmax cancels): its rounding noise is measured against the query
    bias's gradient."""
    if not pname.endswith("attn.k.bias"):
        return False
    err = (p.grad - theirs[pname].grad).abs().max().item()
    errors[f"grad {pname}"] = err
    scale = max(theirs[pname.replace(".k.", ".q.")].grad.abs().max().item(), FLOOR)
    assert err <= REL * scale, f"grad {pname}: max abs error {err:.3e} > {REL:g} x {scale:.3e}"
    return True


def parity(hm, fm, ids, mask, extra=None, grads=True, **kwargs):
    """The shared parity (tests.helpers.modernbert.parity) with the key bias's own check."""
    return shared_parity(hm, fm, ids, mask, extra, grads, grad_check=key_bias_check, **kwargs)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", NAMES[:4])
@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_matches_transformers(backend_name, name, padded):
    require(backend_name)
    hm, fm = pair(name)
    fm.set_backend(backend_name)
    g = torch.Generator().manual_seed(1)
    ids, mask = batch(4, 30, g, LENGTHS if padded else None)
    errors = parity(hm, fm, ids, mask, labels_for(name, ids, mask, g))
    assert any(k.endswith("encoder.relative_attention_bias.weight") for k in errors)
    assert "pooler_output" in errors if name == "MPNetModel" else "loss" in errors


@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_question_answering_matches_transformers(backend_name):
    """Its loss softmaxes over padded positions too: checked on a batch without padding."""
    require(backend_name)
    name = "MPNetForQuestionAnswering"
    hm, fm = pair(name)
    fm.set_backend(backend_name)
    g = torch.Generator().manual_seed(3)
    ids, mask = batch(3, 30, g)
    assert "loss" in parity(hm, fm, ids, mask, labels_for(name, ids, mask, g))


@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_packed_and_padded_paths_agree(backend_name):
    """The packed path (a batch with padding, by default) and the padded one (unpad_inputs=False)
    both match transformers, and each other: outputs and every gradient."""
    require(backend_name)
    name = "MPNetForTokenClassification"
    hm, fm = pair(name)
    fm.set_backend(backend_name)
    g = torch.Generator().manual_seed(6)
    ids, mask = batch(4, 30, g, LENGTHS)
    extra = labels_for(name, ids, mask, g)
    assert_paths_agree(hm, fm, fm.mpnet, ids, mask, extra, parity)


def test_sequence_classifier_runs_its_last_layer_at_the_first_token(monkeypatch):
    """The classifier reads the first token only: the last layer runs there alone
    (BertLayer.first_tokens, with the first query's row of the bias), padded batch or not."""
    from fastbert.model.layers import BertLayer

    calls = []
    original = BertLayer.first_tokens
    monkeypatch.setattr(BertLayer, "first_tokens", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    name = "MPNetForSequenceClassification"
    hm, fm = pair(name)
    fm.set_backend("cpp")
    g = torch.Generator().manual_seed(4)
    for lengths in (LENGTHS, None):
        ids, mask = batch(4, 30, g, lengths)
        hm.zero_grad()
        fm.zero_grad()
        parity(hm, fm, ids, mask, labels_for(name, ids, mask, g))
    assert len(calls) == 2


def test_attentions_hidden_states_and_inputs_embeds_match_transformers():
    """output_attentions takes the explicit path (the bias spread over [heads, seq, seq]): the
    probabilities, the hidden states and their gradients match transformers'."""
    hm, fm = pair("MPNetForMaskedLM")
    fm.set_backend("cpp")
    g = torch.Generator().manual_seed(5)
    ids, mask = batch(4, 30, g, LENGTHS)
    extra = labels_for("MPNetForMaskedLM", ids, mask, g)
    errors = parity(hm, fm, ids, mask, extra, output_attentions=True, output_hidden_states=True)
    assert len([k for k in errors if k.startswith("hidden_states")]) == SMALL["num_hidden_layers"] + 1
    assert len([k for k in errors if k.startswith("attentions")]) == SMALL["num_hidden_layers"]
    embeds = torch.randn(4, 30, SMALL["hidden_size"], generator=g)
    with torch.no_grad():
        got, want = (m.mpnet(inputs_embeds=embeds, attention_mask=mask).last_hidden_state[mask.bool()] for m in (fm, hm))
    check_close(errors, "inputs_embeds", got, want)


def test_the_relative_position_bias_matters(monkeypatch):
    """The parity above can fail: without the bias, the outputs are far from transformers'."""
    hm, fm = pair("MPNetModel")
    g = torch.Generator().manual_seed(7)
    ids, mask = batch(4, 30, g, LENGTHS)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        monkeypatch.setattr(fm, "relative_position_bias", lambda seq: None)
        got = fm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert (got - want).abs().max() > 100 * 1e-4 * want.abs().max()


def test_int8_close_to_fp32_with_the_bias(tmp_path):
    require("cpp")
    hm, fp32 = pair("MPNetModel")
    hm.save_pretrained(tmp_path)
    int8 = fastbert.MPNetModel.from_pretrained(str(tmp_path), quantize="int8")
    g = torch.Generator().manual_seed(8)
    ids, mask = batch(4, 30, g, LENGTHS)
    real = mask.bool()
    with torch.no_grad():
        a = int8(input_ids=ids, attention_mask=mask).last_hidden_state[real]
        b = fp32(input_ids=ids, attention_mask=mask).last_hidden_state[real]
        fp32.relative_position_bias = lambda seq: None
        c = fp32(input_ids=ids, attention_mask=mask).last_hidden_state[real]
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    assert cos.min() > 0.99, f"lowest cosine {cos.min():.4f}"
    assert (a - b).abs().max() < 0.5 * (c - b).abs().max()  # int8 error well below the bias's effect


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_both_ways(tmp_path, name):
    hm, _ = pair(name)
    inputs = batch(4, 30, torch.Generator().manual_seed(9), LENGTHS)
    saved = assert_checkpoints_both_ways(tmp_path, hm, name, inputs, MAIN.get(name, "logits"))
    assert saved["model_type"] == "mpnet"
    assert saved["relative_attention_num_buckets"] == 32 and "type_vocab_size" not in saved


def test_auto_classes_and_config(tmp_path):
    transformers.DebertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=48).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"model_type 'deberta' is not supported; supported: .*\bmpnet\b"):
        fastbert.AutoModel.from_pretrained(str(tmp_path))
    hf_config().save_pretrained(tmp_path / "m")
    config = fastbert.AutoConfig.from_pretrained(str(tmp_path / "m"))
    assert isinstance(config, fastbert.MPNetConfig) and config.relative_attention_num_buckets == 32
    assert type(fastbert.AutoModelForMaskedLM.from_config(config)) is fastbert.MPNetForMaskedLM
    defaults = fastbert.MPNetConfig()
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "pad_token_id", "max_position_embeddings"):
        assert getattr(defaults, field) == getattr(transformers.MPNetConfig(), field), field
    with pytest.raises(TypeError, match="MPNetModel takes a fastbert.MPNetConfig"):
        fastbert.MPNetModel(fastbert.BertConfig())
    with pytest.raises(ValueError, match="MPNet has no token types"):
        fastbert.MPNetModel(config)(input_ids=torch.tensor([[0, 5, 2]]), token_type_ids=torch.tensor([[0, 1, 1]]))


def test_patch_runs_a_transformers_mpnet_on_fastbert():
    hm, _ = pair("MPNetForSequenceClassification")
    g = torch.Generator().manual_seed(10)
    ids, mask = batch(4, 30, g, LENGTHS)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).logits
        fastbert.patch(hm)
        got = hm(input_ids=ids, attention_mask=mask).logits
    assert isinstance(hm.fastbert_model, fastbert.MPNetForSequenceClassification)
    assert hm.fastbert_model.classifier.out_proj.weight is hm.classifier.out_proj.weight
    check_close({}, "patched logits", got, want)


def test_all_mpnet_base_v2_shape_matches_transformers():
    """all-mpnet-base-v2's configuration (MPNetConfig's defaults: hidden 768, 12 layers, 12 heads,
    vocab 30527; its 514 positions) with random weights, on a short padded batch: last_hidden_state
    at real tokens."""
    require("cpp")
    from transformers.initialization import no_init_weights

    hc = transformers.MPNetConfig(max_position_embeddings=514, attn_implementation="eager")
    assert (hc.hidden_size, hc.num_hidden_layers, hc.num_attention_heads, hc.vocab_size) == (768, 12, 12, 30527)
    with no_init_weights():  # every weight is drawn below
        hm = transformers.MPNetModel(hc, add_pooling_layer=False).eval()
    randomize(hm, 11, scale=0.02)
    assert_full_size_matches(hm, parity, 48, 30, pad=PAD, add_pooling_layer=False)
