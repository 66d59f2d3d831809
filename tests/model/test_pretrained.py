"""from_pretrained's keyword arguments, as transformers takes them: config overrides, dtype /
torch_dtype, config=, ignore_mismatched_sizes, output_loading_info; an unknown keyword is an error."""
import pytest
import torch

import fastbert

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A BertForSequenceClassification checkpoint with 3 labels, saved by transformers in bf16 ("dtype")."""
    path = str(tmp_path_factory.mktemp("ckpt"))
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig(**TINY, num_labels=3)).save_pretrained(path)
    return path


def test_config_overrides_like_transformers(saved):
    ours = fastbert.BertForSequenceClassification.from_pretrained(
        saved, num_labels=3, hidden_dropout_prob=0.25, classifier_dropout=0.3)
    theirs = transformers.BertForSequenceClassification.from_pretrained(
        saved, num_labels=3, hidden_dropout_prob=0.25, classifier_dropout=0.3)
    for key in ("num_labels", "hidden_dropout_prob", "classifier_dropout"):
        assert getattr(ours.config, key) == getattr(theirs.config, key), key
    assert ours.dropout.p == 0.3 and ours.bert.encoder.layer[0].output.dropout.p == 0.25


def test_new_label_count_needs_ignore_mismatched_sizes(saved):
    with pytest.raises(ValueError, match="ignore_mismatched_sizes=True"):
        fastbert.BertForSequenceClassification.from_pretrained(saved, num_labels=5)
    with pytest.warns(UserWarning, match="of another shape"):
        model, info = fastbert.BertForSequenceClassification.from_pretrained(
            saved, num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True)
    assert model.classifier.out_features == 5 and model.config.num_labels == 5
    assert {k for k, _, _ in info["mismatched_keys"]} == {"classifier.weight", "classifier.bias"}
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []


@pytest.mark.parametrize("kw", [dict(dtype=torch.bfloat16), dict(torch_dtype=torch.bfloat16),
                                dict(torch_dtype="bfloat16"), dict(dtype="bf16")])
def test_dtype_and_torch_dtype(saved, kw):
    model = fastbert.BertModel.from_pretrained(saved, **kw)
    assert model.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_dtype_auto_reads_the_checkpoint(saved, tmp_path):
    fastbert.BertModel.from_pretrained(saved, dtype=torch.bfloat16).save_pretrained(str(tmp_path))
    assert fastbert.BertModel.from_pretrained(str(tmp_path), dtype="auto").dtype == torch.bfloat16
    assert fastbert.BertModel.from_pretrained(str(tmp_path)).dtype == torch.float32  # as transformers: fp32 unless asked


def test_unknown_keyword_is_an_error(saved):
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_lables'"):
        fastbert.BertForSequenceClassification.from_pretrained(saved, num_lables=5)
    with pytest.raises(ValueError, match="disagree"):
        fastbert.BertModel.from_pretrained(saved, dtype=torch.float16, torch_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="quantize='int4' is not supported; choose 'int8' or None"):
        fastbert.BertModel.from_pretrained(saved, quantize="int4")


def test_hub_arguments_are_accepted_and_config_object(saved):
    cfg = fastbert.BertConfig.from_pretrained(saved)
    cfg.attention_probs_dropout_prob = 0.0
    model = fastbert.BertModel.from_pretrained(saved, config=cfg, local_files_only=True, revision="main",
                                               attn_implementation="sdpa")
    assert model.config.attention_probs_dropout_prob == 0.0
    hf_cfg = transformers.BertConfig.from_pretrained(saved)
    assert fastbert.BertModel.from_pretrained(saved, config=hf_cfg).config.hidden_size == 32


def test_random_init_only_when_the_checkpoint_leaves_weights_out(saved, monkeypatch):
    """Loading runs no random init when the checkpoint holds every weight (it would all be
    overwritten: for a 256k-token vocabulary that init took longer than the load); a head the
    checkpoint lacks still gets the init it would have had (a LayerNorm-style zero bias)."""
    calls = []
    from fastbert.model.pretrained import BertPreTrainedModel

    original = BertPreTrainedModel._init_weights
    monkeypatch.setattr(BertPreTrainedModel, "_init_weights",
                        lambda self, m: calls.append(type(m).__name__) or original(self, m))
    full = fastbert.BertForSequenceClassification.from_pretrained(saved)
    assert calls == []
    want = transformers.BertForSequenceClassification.from_pretrained(saved).state_dict()
    got = full.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want if k in got)
    with pytest.warns(UserWarning, match="missing"):
        new_head = fastbert.BertForMaskedLM.from_pretrained(saved)
    assert "Linear" in calls
    dense = new_head.cls.predictions.transform.dense
    assert torch.equal(dense.bias, torch.zeros(32))  # the init ran: torch's own bias is not zero
    assert 0.01 < dense.weight.std().item() < 0.03  # initializer_range 0.02
    built = fastbert.BertModel(fastbert.BertConfig(**TINY))  # outside from_pretrained the init runs as before
    assert torch.equal(built.encoder.layer[0].output.dense.bias, torch.zeros(32))


def test_trunc_normal_draws_the_truncated_normal():
    from fastbert.model.model_utils import trunc_normal_

    torch.manual_seed(0)
    t = trunc_normal_(torch.empty(200_000), 0.02, 2.0)
    assert t.abs().max().item() <= 0.04
    ref = torch.nn.init.trunc_normal_(torch.empty(200_000), 0.0, 0.02, -0.04, 0.04)
    assert abs(t.std().item() - ref.std().item()) < 3e-4 and abs(t.mean().item()) < 3e-4
    assert (t.abs() > 0.035).float().mean().item() > 0.01  # the tails are there, not clipped away
