"""RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT and GTE on fastbert's one encoder, against transformers'
classes built from each family's configuration with random weights: every output and every
parameter's gradient (fp32), checkpoints both ways, the Auto classes and their errors."""
import json
import re

import pytest
import torch

import fastbert
from tests.helpers.backends import device_for, require
from tests.helpers.bert import TOL, compare
from tests.helpers.families import CONFIGS, PREFIX, batch, hf_config, labels_for, pair

transformers = pytest.importorskip("transformers")

TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
# (GTE has no question-answering head, in transformers or here)
CASES = [(f, PREFIX[f] + t) for f in CONFIGS for t in TASKS if hasattr(transformers, PREFIX[f] + t)] + [
    ("electra", "ElectraForPreTraining")]


def check_against_transformers(backend, family, name):
    dev = device_for(backend)
    hm, fm = pair(family, name)
    hm.to(dev), fm.to(dev).set_backend(backend)
    g = torch.Generator().manual_seed(1)
    ids, mask, tt = (None if t is None else t.to(dev) for t in batch(family, 4, 13, g))
    extra = {k: v.to(dev) for k, v in labels_for(name, ids, mask, g).items()}
    compare(name, hm, fm, ids, mask, tt, extra, torch.float32)


# every class on the C++ kernels in the quick loop, on the torch reference layers too in the full suite
@pytest.mark.parametrize("backend_name", [pytest.param("torch", marks=pytest.mark.slow), "cpp"])
@pytest.mark.parametrize("family,name", CASES)
def test_matches_transformers(backend_name, family, name):
    require(backend_name)
    check_against_transformers(backend_name, family, name)


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_matches_transformers_on_triton(family):
    """One class a family on the Triton kernels (the MLM model: the family's embeddings, the encoder
    and a head); the kernels themselves are tested in tests/ops and tests/kernels."""
    require("triton")
    check_against_transformers("triton", family, PREFIX[family] + "ForMaskedLM")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["roberta", "electra", "distilbert"])
def test_question_answering_loss(family):
    hm, fm = pair(family, PREFIX[family] + "ForQuestionAnswering")
    g = torch.Generator().manual_seed(2)
    ids, mask, tt = batch(family, 3, 11, g, pad=False)
    extra = dict(start_positions=torch.tensor([1, 4, 20]), end_positions=torch.tensor([2, 9, 3]))
    compare(family, hm, fm, ids, mask, tt, extra, torch.float32)


@pytest.mark.parametrize("family,name", [(f, PREFIX[f] + t) for f in CONFIGS for t in ("Model", "ForMaskedLM",
                                                                                      "ForSequenceClassification")])
def test_checkpoints_both_ways(tmp_path, family, name):
    """transformers' checkpoint -> fastbert (from_pretrained and the Auto class) -> save_pretrained ->
    transformers' from_pretrained: the same outputs, nothing missing or left over either way."""
    hm, fm = pair(family, name, tmp_path / "hf")
    auto = {"Model": fastbert.AutoModel, "ForMaskedLM": fastbert.AutoModelForMaskedLM,
            "ForSequenceClassification": fastbert.AutoModelForSequenceClassification}[name[len(PREFIX[family]):]]
    assert type(auto.from_pretrained(str(tmp_path / "hf"))) is type(fm)
    fm.save_pretrained(str(tmp_path / "fb"))
    saved = json.loads((tmp_path / "fb" / "config.json").read_text())
    assert saved["model_type"] == family and saved["architectures"] == [name]
    back, info = getattr(transformers, name).from_pretrained(str(tmp_path / "fb"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    g = torch.Generator().manual_seed(3)
    ids, mask, tt = batch(family, 3, 9, g)

    def main_output(model):
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask)
        value = out.last_hidden_state if name == PREFIX[family] + "Model" else out.logits
        return value[mask.bool()] if value.shape[:2] == ids.shape else value

    want = main_output(hm)
    torch.testing.assert_close(main_output(fm), want, **TOL[torch.float32])
    torch.testing.assert_close(main_output(back.eval()), want, **TOL[torch.float32])


def test_roberta_positions_follow_the_padding_id():
    """RoBERTa's position ids count real tokens from pad + 1, wherever the padding is (left
    padding too), as transformers numbers them."""
    hm, fm = pair("roberta", "RobertaModel")
    ids = torch.tensor([[1, 1, 5, 6, 7], [5, 6, 7, 8, 9]])
    mask = (ids != 1).long()
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).last_hidden_state
        got = fm(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL[torch.float32])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        fm(input_ids=torch.full((1, 65), 5))  # 66 positions, pad 1: room for 64 tokens


@pytest.mark.parametrize("family", ["xlm-roberta", "electra", "distilbert"])
def test_sequence_classifier_runs_its_last_layer_at_the_first_token(monkeypatch, family):
    """RoBERTa's and ELECTRA's classifiers read the first token only: fastbert runs the last layer
    there alone (BertLayer.first_tokens), and the logits and gradients still equal transformers'."""
    from fastbert.model.layers import BertLayer

    calls = []
    original = BertLayer.first_tokens
    monkeypatch.setattr(BertLayer, "first_tokens", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    name = PREFIX[family] + "ForSequenceClassification"
    hm, fm = pair(family, name)
    g = torch.Generator().manual_seed(4)
    ids, mask, tt = batch(family, 3, 12, g)
    compare(name, hm, fm, ids, mask, tt, labels_for(name, ids, mask, g), torch.float32)
    assert len(calls) == 1


def test_auto_classes_refuse_what_they_do_not_run(tmp_path):
    cfg = transformers.DebertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=48)
    cfg.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"model_type 'deberta' is not supported; supported: bert, camembert, "
                                         r"deberta-v2, distilbert, electra, eurobert, gte, jina_embeddings_v3, "
                                         r"modernbert, mpnet, nomic_bert, roberta, xlm-roberta"):
        fastbert.AutoModel.from_pretrained(str(tmp_path))
    hf_config("roberta").save_pretrained(tmp_path / "r")
    with pytest.raises(ValueError, match="describes a 'roberta' model, not 'bert'"):
        fastbert.BertModel.from_pretrained(str(tmp_path / "r"))
    with pytest.raises(TypeError, match="RobertaModel takes a fastbert.RobertaConfig"):
        fastbert.RobertaModel(fastbert.BertConfig())
    with pytest.raises(EnvironmentError, match="from_pretrained"):
        fastbert.AutoModel()
    assert isinstance(fastbert.AutoConfig.from_pretrained(str(tmp_path / "r")), fastbert.RobertaConfig)
    assert type(fastbert.AutoModelForTokenClassification.from_config(fastbert.ElectraConfig(**CONFIGS["electra"]))) \
        is fastbert.ElectraForTokenClassification


@pytest.mark.parametrize("family", ["xlm-roberta", "distilbert"])
def test_masked_lm_decoder_at_the_labelled_tokens_only(family):
    """config.dense_seq_output: logits at the labelled tokens only, the same loss and gradients."""
    name = PREFIX[family] + "ForMaskedLM"
    hm, fm = pair(family, name)
    g = torch.Generator().manual_seed(6)
    ids, mask, _ = batch(family, 4, 13, g)
    labels = labels_for(name, ids, mask, g)["labels"]
    full = fm(input_ids=ids, attention_mask=mask, labels=labels)
    full.loss.backward()
    want = {n: p.grad.clone() for n, p in fm.named_parameters() if p.grad is not None}
    fm.zero_grad()
    fm.config.dense_seq_output = True
    dense = fm(input_ids=ids, attention_mask=mask, labels=labels)
    dense.loss.backward()
    picked = labels.reshape(-1) != -100
    assert dense.logits.shape == (int(picked.sum()), CONFIGS[family]["vocab_size"])
    torch.testing.assert_close(dense.logits, full.logits.reshape(-1, full.logits.shape[-1])[picked])
    torch.testing.assert_close(dense.loss, full.loss)
    for n, p in fm.named_parameters():
        if n in want:
            torch.testing.assert_close(p.grad, want[n], msg=n)


def test_distilbert_arguments_in_transformers_order():
    """DistilBERT's heads take (input_ids, attention_mask, inputs_embeds, labels / start_positions,
    end_positions, ...) as transformers' do, positionally too."""
    import inspect

    for head in ("ForSequenceClassification", "ForMaskedLM", "ForQuestionAnswering"):
        ours = list(inspect.signature(getattr(fastbert, "DistilBert" + head).forward).parameters)[1:5]
        theirs = list(inspect.signature(getattr(transformers, "DistilBert" + head).forward).parameters)[1:5]
        assert ours == theirs, (head, ours, theirs)
    hm, fm = pair("distilbert", "DistilBertForSequenceClassification")
    g = torch.Generator().manual_seed(8)
    ids, mask, _ = batch("distilbert", 3, 9, g)
    labels = torch.tensor([0, 2, 1])
    got, want = fm(ids, mask, None, labels), hm(ids, mask, None, labels)
    torch.testing.assert_close(got.loss, want.loss, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.logits, want.logits, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_checkpoints_that_would_load_partly_are_refused(tmp_path, family):
    """Encoder weights a checkpoint lacks, or holds beyond the architecture, are an error naming them;
    a new head (missing) or another head (left over) stays a warning, as in transformers."""
    from safetensors.torch import load_file, save_file

    hm, _ = pair(family, PREFIX[family] + "ForMaskedLM", tmp_path / "mlm")
    weights = tmp_path / "mlm" / "model.safetensors"
    state = load_file(str(weights))
    base = hm.base_model_prefix
    with pytest.warns(UserWarning, match="missing") as caught:
        getattr(fastbert, PREFIX[family] + "ForSequenceClassification").from_pretrained(str(tmp_path / "mlm"))
    assert "classifier" in str(caught[0].message) and "unexpected" in str(caught[0].message)

    layer_key = next(k for k in sorted(state) if k.startswith(base + ".") and ".0." in k)  # in the file's own names
    extra = layer_key.rsplit(".", 2)[0] + ".rel_bias.weight"
    save_file(dict(state, **{extra: torch.zeros(4, 2)}), str(weights))
    for name in ("Model", "ForMaskedLM", "ForSequenceClassification"):
        with pytest.raises(ValueError, match=r"holds encoder weights .*rel_bias.weight.*nothing was loaded"):
            getattr(fastbert, PREFIX[family] + name).from_pretrained(str(tmp_path / "mlm"))

    save_file({k: v for k, v in state.items() if not re.search(r"\.layers?\.1\.", k)}, str(weights))
    with pytest.raises(ValueError, match=r"lacks encoder weights \[.*layers?\.1\..*more\] \(they would stay at random"):
        getattr(fastbert, PREFIX[family] + "Model").from_pretrained(str(tmp_path / "mlm"))


def test_distilbert_fresh_sinusoidal_positions_as_transformers_makes_them():
    """sinusoidal_pos_embds=True: a fresh model's position table is DistilBERT's fixed sinusoid
    (the values transformers initialises), kept out of training; False: random, trained."""
    cfg = dict(CONFIGS["distilbert"], sinusoidal_pos_embds=True)
    want = transformers.DistilBertModel(transformers.DistilBertConfig(**cfg)).embeddings.position_embeddings.weight
    assert want[1:].abs().max() > 0.5  # the sinusoid, not a small random init
    for name in ("DistilBertModel", "DistilBertForMaskedLM", "DistilBertForQuestionAnswering"):
        got = getattr(fastbert, name)(fastbert.DistilBertConfig(**cfg)).base_model.embeddings.position_embeddings.weight
        torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-6)
        assert not got.requires_grad
    plain = fastbert.DistilBertModel(fastbert.DistilBertConfig(**CONFIGS["distilbert"])).embeddings.position_embeddings
    assert plain.weight.requires_grad and plain.weight.abs().max() < 0.2
