"""GTE on fastbert against transformers' own GTE classes, fp32: every output at real tokens, the losses and
every parameter's gradient, with seeded random weights (every tensor drawn afresh) on a small config
whose rotary base is small enough that positions matter at these lengths; batches with and without
padding (left padding too: rotary scores depend on distances only), on the cpp and torch backends; the
packed and the padded paths; the explicit path (attention probabilities: q and k rotated outside the
kernel); int8 with the gated feed-forward; checkpoints both ways, in the files' own names (the
original model's, which transformers writes); the config's rope fields; gte-multilingual-base's shape.
(RoBERTa's and the other families' shared checks run GTE too: tests/model/test_families.py.)"""
import json

import pytest
import torch

import fastbert
from tests.helpers.backends import require
from tests.helpers.modernbert import (
    FLOOR,
    LENGTHS,
    REL,
    assert_checkpoints_both_ways,
    assert_full_size_matches,
    assert_paths_agree,
    check_close,
    labels_for,
    parity,
)
from tests.helpers.modernbert import batch as shared_batch

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=100, hidden_size=64, num_attention_heads=4, num_hidden_layers=3, intermediate_size=96,
             type_vocab_size=2, hidden_dropout_prob=0.0, pad_token_id=1, rope_parameters={"rope_theta": 500.0,
                                                                                          "rope_type": "default"})
CLS, PAD, SEP = 0, 1, 2
IDS = dict(vocab_size=SMALL["vocab_size"], cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD)
NAMES = ["GteModel", "GteForMaskedLM", "GteForSequenceClassification", "GteForTokenClassification"]
MAIN = {"GteModel": "last_hidden_state"}
pytestmark = pytest.mark.usefixtures("one_thread")


def randomize(model, seed, scale=0.1):
    """Every parameter drawn afresh: LayerNorm weights 1 + N(0, scale), the rest N(0, scale)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = scale * torch.randn(p.shape, generator=g)
            p.copy_(1 + noise if "norm" in name.lower() and name.endswith("weight") else noise)


def hf_config(**kw):
    return transformers.GteConfig(**dict(SMALL, **kw), attn_implementation="eager")


def pair(name, seed=0, **kw):
    """(transformers' model, fastbert's) with the same random weights, loaded strictly (every key)."""
    torch.manual_seed(seed)
    hm = getattr(transformers, name)(hf_config(num_labels=3, **kw)).eval()
    randomize(hm, seed)
    cls = getattr(fastbert, name)
    fm = cls(cls.config_class(**hm.config.to_dict())).eval()
    fm.load_state_dict(hm.state_dict(), strict=True)
    return hm, fm


def batch(bsz, seq, g, lengths=None, left=False):
    """(input_ids: [CLS] ... [SEP] then padding, attention_mask, token_type_ids: 1 on the second half)."""
    ids, mask = shared_batch(bsz, seq, g, lengths, left, config=IDS)
    return ids, mask, (torch.arange(seq) >= seq // 2).long().expand(bsz, seq) * mask


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_matches_transformers(backend_name, name, padded):
    require(backend_name)
    hm, fm = pair(name)
    fm.set_backend(backend_name)
    g = torch.Generator().manual_seed(1)
    ids, mask, types = batch(4, 30, g, LENGTHS if padded else None)
    errors = parity(hm, fm, ids, mask, dict(labels_for(name, ids, mask, g), token_type_ids=types))
    assert any("gate_proj" in k for k in errors) and any("token_type_embeddings" in k for k in errors)
    assert "last_hidden_state" in errors if name == "GteModel" else "loss" in errors


def test_left_padding_matches_transformers():
    """transformers rotates by the index in the padded row; fastbert, packed, by the index within the
    sequence: the scores depend on distances only, so left padding gives the same outputs."""
    require("cpp")
    hm, fm = pair("GteForTokenClassification")
    fm.set_backend("cpp")
    g = torch.Generator().manual_seed(2)
    ids, mask, types = batch(4, 30, g, LENGTHS, left=True)
    parity(hm, fm, ids, mask, dict(labels_for("GteForTokenClassification", ids, mask, g), token_type_ids=types))


@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_packed_and_padded_paths_agree(backend_name):
    require(backend_name)
    name = "GteForTokenClassification"
    hm, fm = pair(name)
    fm.set_backend(backend_name)
    g = torch.Generator().manual_seed(6)
    ids, mask, _ = batch(4, 30, g, LENGTHS)
    assert_paths_agree(hm, fm, fm.gte, ids, mask, labels_for(name, ids, mask, g), parity)


def test_attentions_hidden_states_and_inputs_embeds_match_transformers():
    """output_attentions takes the explicit path (q and k rotated outside the kernel): the
    probabilities, the hidden states and their gradients match transformers'."""
    hm, fm = pair("GteForMaskedLM")
    fm.set_backend("cpp")
    g = torch.Generator().manual_seed(5)
    ids, mask, _ = batch(4, 30, g, LENGTHS)
    extra = labels_for("GteForMaskedLM", ids, mask, g)
    errors = parity(hm, fm, ids, mask, extra, output_attentions=True, output_hidden_states=True)
    assert len([k for k in errors if k.startswith("hidden_states")]) == SMALL["num_hidden_layers"] + 1
    assert len([k for k in errors if k.startswith("attentions")]) == SMALL["num_hidden_layers"]
    embeds = torch.randn(4, 30, SMALL["hidden_size"], generator=g)
    with torch.no_grad():
        got, want = (m.gte(inputs_embeds=embeds, attention_mask=mask).last_hidden_state[mask.bool()] for m in (fm, hm))
    check_close(errors, "inputs_embeds", got, want)


def test_the_rotary_positions_matter():
    """The parity above can fail: with another rotary base the outputs are far from transformers'."""
    hm, fm = pair("GteModel")
    g = torch.Generator().manual_seed(7)
    ids, mask, _ = batch(4, 30, g, LENGTHS)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        for layer in fm.layers:
            layer.rotary_base = 1e6
        got = fm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert (got - want).abs().max() > 100 * REL * max(want.abs().max().item(), FLOOR)


def test_position_ids_that_count_along_each_row_and_the_others():
    hm, fm = pair("GteModel")
    g = torch.Generator().manual_seed(8)
    ids, mask, _ = batch(2, 12, g)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).last_hidden_state
        shifted = fm(input_ids=ids, attention_mask=mask, position_ids=torch.arange(5, 17).expand(2, 12))
        check_close({}, "shifted positions", shifted.last_hidden_state, want)
        with pytest.raises(NotImplementedError, match="position_ids other than 0, 1, 2, ... .* for gte yet"):
            fm(input_ids=ids, position_ids=torch.arange(12).flip(0).expand(2, 12))


def test_int8_close_to_fp32_with_the_gated_feed_forward(tmp_path):
    require("cpp")
    hm, fp32 = pair("GteModel")
    hm.save_pretrained(tmp_path)
    int8 = fastbert.GteModel.from_pretrained(str(tmp_path), quantize="int8")
    assert type(int8.layers[0].mlp.gate_proj).__name__ == "Int8Linear"
    g = torch.Generator().manual_seed(9)
    ids, mask, types = batch(4, 30, g, LENGTHS)
    real = mask.bool()
    with torch.no_grad():
        a, b = (m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state[real]
                for m in (int8, fp32))
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    assert cos.min() > 0.99, f"lowest cosine {cos.min():.4f}"


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_both_ways(tmp_path, name):
    """transformers writes GTE's files in the original model's names (joined QKV, up_gate_proj,
    attn_ln, ...): fastbert reads them and writes them back so."""
    hm, _ = pair(name)
    ids, mask, _ = batch(4, 30, torch.Generator().manual_seed(9), LENGTHS)
    saved = assert_checkpoints_both_ways(tmp_path, hm, name, (ids, mask), MAIN.get(name, "logits"))
    assert saved["model_type"] == "gte" and saved["rope_parameters"]["rope_theta"] == 500.0
    from safetensors.torch import load_file

    theirs, ours = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "fb"))
    assert sorted(ours) == sorted(theirs) and any(k.endswith("attention.qkv_proj.weight") for k in ours)
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), k


def test_original_files_under_new_load(tmp_path):
    """A task model of the original GTE code keeps its encoder under "new.": read as "gte."."""
    from safetensors.torch import load_file, save_file

    hm, _ = pair("GteForSequenceClassification")
    hm.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file({("new." + k[4:] if k.startswith("gte.") else k): v for k, v in state.items()},
              str(tmp_path / "model.safetensors"))
    fm = fastbert.GteForSequenceClassification.from_pretrained(str(tmp_path))
    ids, mask, _ = batch(4, 30, torch.Generator().manual_seed(10), LENGTHS)
    with torch.no_grad():
        check_close({}, "logits", fm(input_ids=ids, attention_mask=mask).logits,
                    hm(input_ids=ids, attention_mask=mask).logits)


def test_config_and_auto_classes(tmp_path):
    defaults = fastbert.GteConfig()
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "pad_token_id", "max_position_embeddings",
                  "type_vocab_size", "layer_norm_eps", "attention_probs_dropout_prob"):
        assert getattr(defaults, field) == getattr(transformers.GteConfig(), field), field
    assert defaults.rope_theta == transformers.GteConfig().rope_parameters["rope_theta"] == 160000.0
    assert fastbert.GteConfig(rope_theta=500000.0).rope_theta == 500000.0  # a config written before transformers 5
    with pytest.raises(ValueError, match="rope_type 'ntk' is not supported"):
        fastbert.GteConfig(rope_scaling={"type": "ntk", "factor": 2.0})
    hf_config().save_pretrained(tmp_path)
    config = fastbert.AutoConfig.from_pretrained(str(tmp_path))
    assert isinstance(config, fastbert.GteConfig) and config.rope_theta == 500.0
    assert type(fastbert.AutoModelForTokenClassification.from_config(config)) is fastbert.GteForTokenClassification
    with pytest.raises(ValueError, match=r"model_type 'gte' is not supported; supported: .*\bbert\b"):
        fastbert.AutoModelForQuestionAnswering.from_pretrained(str(tmp_path))


def test_no_token_types_as_gte_base_en():
    """gte-base-en-v1.5 has type_vocab_size 0: no token type table."""
    hm, fm = pair("GteModel", type_vocab_size=0)
    assert not hasattr(fm.embeddings, "token_type_embeddings")
    g = torch.Generator().manual_seed(11)
    ids, mask, _ = batch(4, 30, g, LENGTHS)
    parity(hm, fm, ids, mask)


def test_patch_runs_a_transformers_gte_on_fastbert():
    hm, _ = pair("GteForSequenceClassification")
    g = torch.Generator().manual_seed(10)
    ids, mask, _ = batch(4, 30, g, LENGTHS)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).logits
        fastbert.patch(hm)
        got = hm(input_ids=ids, attention_mask=mask).logits
    assert isinstance(hm.fastbert_model, fastbert.GteForSequenceClassification)
    assert hm.fastbert_model.classifier.weight is hm.classifier.weight
    check_close({}, "patched logits", got, want)


@pytest.mark.slow
def test_gte_multilingual_base_shape_matches_transformers():
    """gte-multilingual-base's configuration (GteConfig's defaults: hidden 768, 12 layers, 12 heads, a
    250,048-token vocabulary, rope_theta 160000) with random weights, on a short padded batch."""
    require("cpp")
    from transformers.initialization import no_init_weights

    hc = transformers.GteConfig(attn_implementation="eager")
    with no_init_weights():
        hm = transformers.GteModel(hc).eval()
    randomize(hm, 11, scale=0.02)
    assert_full_size_matches(hm, parity, 48, 30, pad=PAD)


def test_saved_config_round_trips(tmp_path):
    config = fastbert.GteConfig(**hf_config().to_dict())
    config.save_pretrained(str(tmp_path))
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["model_type"] == "gte" and d["rope_parameters"] == {"rope_theta": 500.0, "rope_type": "default"}
    assert fastbert.GteConfig.from_pretrained(str(tmp_path)) == config
