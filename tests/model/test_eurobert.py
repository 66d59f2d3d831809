"""EuroBERT on fastbert against transformers' own EuroBert classes, fp32: every output at real
tokens, the losses and every parameter's gradient, with seeded random weights (every tensor drawn
afresh, the RMSNorm weights too) on a small config, with and without grouped-query attention;
batches with and without padding; the packed and the padded paths; output_attentions; checkpoints
both ways; the Auto classes; int8; bf16; torch.compile; the Triton kernels (interpreted); what is
not supported, each a clear error."""
import copy

import pytest
import torch

import fastbert
from tests.helpers.backends import require
from tests.helpers.bounds import assert_within_bound
from tests.helpers.modernbert import (
    assert_checkpoints_both_ways,
    assert_paths_agree,
    batch,
    check_close,
    labels_for,
    outputs_and_grads,
    parity,
    randomize,
)
from tests.helpers.profiles import fastbert_op_counts

transformers = pytest.importorskip("transformers")

# 4 heads over 2 key-value heads (grouped-query attention, as EuroBERT-610m / 2.1B have it), a rotary
# base that matters at 30 tokens; the ids the batches use ([CLS] = bos, [SEP] = eos)
SMALL = dict(vocab_size=100, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             num_hidden_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
             rope_parameters={"rope_type": "default", "rope_theta": 500.0})
IDS = dict(vocab_size=100, cls_token_id=1, sep_token_id=2, pad_token_id=0)  # for tests.helpers.modernbert.batch
LENGTHS = (30, 17, 26, 5)
MAIN = {"EuroBertModel": "last_hidden_state", "EuroBertForMaskedLM": "logits",
        "EuroBertForSequenceClassification": "logits", "EuroBertForTokenClassification": "logits"}
pytestmark = pytest.mark.usefixtures("one_thread")


def hf_config(**kw):
    return transformers.EuroBertConfig(**dict(SMALL, **kw), attn_implementation="eager")


def pair(name, seed=0, backend=None, **kw):
    """(transformers' model, fastbert's on `backend`) with the same random weights, loaded strictly."""
    torch.manual_seed(seed)
    hm = getattr(transformers, name)(hf_config(num_labels=3, **kw)).eval()
    randomize(hm, seed)
    cls = getattr(fastbert, name)
    fm = cls(cls.config_class(**hm.config.to_dict())).eval()
    fm.load_state_dict(hm.state_dict(), strict=True)
    return hm, fm.set_backend(backend)


def inputs(name, seed, lengths=LENGTHS, left=False):
    g = torch.Generator().manual_seed(seed)
    ids, mask = batch(4, 30, g, lengths, left, config=IDS)
    return ids, mask, labels_for(name, ids, mask, g)


CASES = [("EuroBertModel", {}), ("EuroBertForMaskedLM", {}),
         ("EuroBertForSequenceClassification", dict(classifier_pooling="late")),
         ("EuroBertForSequenceClassification", dict(classifier_pooling="mean")),
         ("EuroBertForSequenceClassification", dict(classifier_pooling="bos")),
         ("EuroBertForTokenClassification", {})]


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n[8:] or 'Model'}-{kw.get('classifier_pooling', '')}"
                                                 for n, kw in CASES])
@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_matches_transformers(backend_name, name, kw, padded):
    require(backend_name)
    hm, fm = pair(name, backend=backend_name, **kw)
    ids, mask, labels = inputs(name, 1, LENGTHS if padded else None)
    errors = parity(hm, fm, ids, mask, labels)
    assert any("layers.2.mlp.down_proj" in k for k in errors) and (name == "EuroBertModel" or "loss" in errors)


@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_every_head_its_own_keys_and_biases(backend_name):
    """As many key-value heads as heads (one joined QKV through the attention), biased projections and
    MLP, a GELU gate, head_dim other than hidden / heads, an MLM head tied to the embeddings."""
    require(backend_name)
    kw = dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True, hidden_act="gelu", head_dim=8,
              tie_word_embeddings=True)
    hm, fm = pair("EuroBertForMaskedLM", backend=backend_name, **kw)
    assert fm.lm_head.weight is fm.model.embed_tokens.weight and fm.config.head_dim == 8
    ids, mask, labels = inputs("EuroBertForMaskedLM", 2)
    parity(hm, fm, ids, mask, labels)


@pytest.mark.triton
@pytest.mark.parametrize("kv", [2, 4])
def test_triton_kernels_match_transformers(kv):
    """The Triton kernels (the interpreter here): the fused add + RMSNorm, rotary attention (joined QKV
    without grouped heads), SwiGLU, forward and every gradient."""
    require("triton")
    hm, fm = pair("EuroBertForTokenClassification", backend="triton", num_key_value_heads=kv, num_hidden_layers=2)
    ids, mask, labels = inputs("EuroBertForTokenClassification", 3, (12, 7, 9, 4))
    first = slice(0, 12)  # the batch's first 12 positions: every row's real tokens
    parity(hm, fm, ids[:, first].contiguous(), mask[:, first].contiguous(),
           {"labels": labels["labels"][:, first].contiguous()})


@pytest.mark.parametrize("backend_name", ["torch", "cpp"])
def test_packed_and_padded_paths_agree(backend_name):
    require(backend_name)
    name = "EuroBertForTokenClassification"
    hm, fm = pair(name, backend=backend_name)
    ids, mask, labels = inputs(name, 4)
    assert_paths_agree(hm, fm, fm.model, ids, mask, labels, parity)


def test_left_padding_and_the_rotary_base_matter():
    """Left padding gives transformers' outputs (rotary scores depend on distances); another rotary
    base gives other outputs."""
    hm, fm = pair("EuroBertModel", backend="torch")
    ids, mask, _ = inputs("EuroBertModel", 5, left=True)
    parity(hm, fm, ids, mask, grads=False)
    _, other = pair("EuroBertModel", backend="torch", rope_parameters={"rope_type": "default", "rope_theta": 10.0})
    with torch.no_grad():
        a, b = (m(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()] for m in (fm, other))
    assert (a - b).abs().max() > 1e-2


@pytest.mark.parametrize("name", list(MAIN))
def test_checkpoints_both_ways(tmp_path, name):
    hm, _ = pair(name)
    ids, mask, _ = inputs(name, 6)
    saved = assert_checkpoints_both_ways(tmp_path, hm, name, (ids, mask), MAIN[name])
    assert saved["model_type"] == "eurobert" and saved["num_key_value_heads"] == 2


def test_config_reads_what_transformers_reads(tmp_path):
    ours, theirs = fastbert.EuroBertConfig(), transformers.EuroBertConfig()
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "hidden_act", "rms_norm_eps", "pad_token_id", "bos_token_id", "eos_token_id",
                  "mask_token_id", "tie_word_embeddings", "classifier_pooling", "head_dim", "max_position_embeddings"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    # EuroBERT-210m's published config.json: rope_theta at the top level, as configs before transformers 5 have it
    theirs = transformers.EuroBertConfig(rope_theta=250000.0, num_key_value_heads=4)
    ours = fastbert.EuroBertConfig.from_dict(theirs.to_dict())
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 250000.0
    assert ours.num_key_value_heads == 4
    assert fastbert.EuroBertConfig(rope_theta=250000.0).rope_theta == 250000.0
    theirs.save_pretrained(tmp_path)
    assert fastbert.AutoConfig.from_pretrained(str(tmp_path)).to_dict()["rope_parameters"]["rope_theta"] == 250000.0
    with pytest.raises(ValueError, match="num_attention_heads 12 is not a multiple of num_key_value_heads 5"):
        fastbert.EuroBertConfig(num_key_value_heads=5)
    with pytest.raises(ValueError, match="classifier_pooling must be one of"):
        fastbert.EuroBertConfig(classifier_pooling="cls")


def test_auto_classes_name_eurobert(tmp_path):
    hm, _ = pair("EuroBertForSequenceClassification")
    hm.save_pretrained(tmp_path)
    assert type(fastbert.AutoModelForSequenceClassification.from_pretrained(str(tmp_path))).__name__ == \
        "EuroBertForSequenceClassification"
    assert type(fastbert.AutoModel.from_pretrained(str(tmp_path))) is fastbert.EuroBertModel
    with pytest.raises(ValueError, match="model_type 'eurobert' is not supported; supported: .*"):
        fastbert.AutoModelForQuestionAnswering.from_pretrained(str(tmp_path))


def test_what_is_not_supported_is_a_clear_error():
    _, fm = pair("EuroBertForMaskedLM")
    ids, _ = batch(2, 12, torch.Generator().manual_seed(9), config=IDS)
    for kwargs, what in ((dict(position_ids=torch.randperm(12)[None]), "position_ids.* not supported"),
                         (dict(attention_mask=torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()), "other than a padding"),
                         (dict(head_mask=torch.ones(3)), "no head_mask: transformers' EuroBertModel has none")):
        for model in (fm, fm.model):
            with pytest.raises(NotImplementedError, match=what):
                model(input_ids=ids, **kwargs)


@pytest.mark.parametrize("padded", [True, False])
def test_output_attentions_and_hidden_states_match_transformers_eager(padded):
    require("cpp")
    name = "EuroBertModel"
    hm, fm = pair(name, backend="cpp")
    ids, mask, labels = inputs(name, 15, LENGTHS if padded else None)
    errors = parity(hm, fm, ids, mask, labels, output_attentions=True, output_hidden_states=True)
    assert len([k for k in errors if k.startswith("attentions")]) == SMALL["num_hidden_layers"]
    assert len([k for k in errors if k.startswith("hidden_states")]) == SMALL["num_hidden_layers"] + 1


def test_int8_is_close_to_fp32_and_inference_only():
    require("cpp")
    name = "EuroBertForSequenceClassification"
    hm, fm = pair(name, backend="cpp")
    ids, mask, _ = inputs(name, 7)
    with torch.no_grad():
        want = fm.model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        fm.quantize_("int8")
        got = fm.model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert type(fm.model.layers[0].self_attn.q_proj).__name__ == "Int8Linear"
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert cos.min() > 0.99, cos.min()
    with torch.no_grad():  # SwiGLU in one pass: the gate and up products' dequantization, the gate, the quantization
        counts = fastbert_op_counts(lambda: fm.model(input_ids=ids, attention_mask=mask))
    # (on a packed weight the product is inside the same op, int8_packed_glu)
    assert counts["int8_glu"] + counts["int8_packed_glu"] == SMALL["num_hidden_layers"], counts
    with pytest.raises(RuntimeError, match="quantized to int8 for inference"):
        fm.train()(input_ids=ids, attention_mask=mask)


def test_int8_with_key_values_too_narrow_for_the_packed_layout(monkeypatch):
    # 8-row key and value projections stay [out, in] where the 32-row query packs: each multiplies on its own
    require("cpp")
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", "packed")
    name = "EuroBertModel"
    hm, fm = pair(name, backend="cpp", num_key_value_heads=1, head_dim=8)
    ids, mask, _ = inputs(name, 8)
    with torch.no_grad():
        want = fm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        fm.quantize_("int8")
        got = fm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    attn = fm.layers[0].self_attn
    assert attn.q_proj.weight.dim() == 4 and attn.k_proj.weight.dim() == 2
    assert torch.nn.functional.cosine_similarity(got, want, dim=-1).min() > 0.99


@pytest.mark.parametrize("mode", ["bf16 model", "autocast"])
def test_bf16_within_transformers_bound(mode):
    require("cpp")
    name = "EuroBertForTokenClassification"
    hm, fm = pair(name, backend="cpp")
    ids, mask, labels = inputs(name, 14)
    exact = copy.deepcopy(hm).double()
    exact.set_attn_implementation("sdpa")
    ours, theirs, ref = (outputs_and_grads(m, ids, mask, labels, md) for m, md in ((fm, mode), (hm, mode), (exact, None)))
    for key in ref:
        assert_within_bound(f"{mode} {key}", ours[key], theirs[key], ref[key].double(), torch.bfloat16)


def test_torch_compile_fullgraph_like_eager():
    require("cpp")
    name = "EuroBertForTokenClassification"
    _, model = pair(name, backend="cpp", num_hidden_layers=2)
    ids, mask, labels = inputs(name, 16)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    eager, got = (outputs_and_grads(model, ids, mask, labels, fn=fn) for fn in (model, compiled))
    for key in eager:
        torch.testing.assert_close(got[key], eager[key], rtol=1e-4, atol=1e-5, msg=key)


def test_patch_runs_a_transformers_eurobert_on_fastbert():
    hm, _ = pair("EuroBertForSequenceClassification")
    ids, mask, _ = inputs("EuroBertForSequenceClassification", 13)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).logits
        fastbert.patch(hm)
        got = hm(input_ids=ids, attention_mask=mask).logits
    assert isinstance(hm.fastbert_model, fastbert.EuroBertForSequenceClassification)
    check_close({}, "patched logits", got, want)
