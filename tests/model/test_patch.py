"""fastbert.patch on models transformers loaded: equal outputs, the same Parameter objects (an
optimizer built before the patch trains the patched model, and the forward always sees the current
weights), train/eval followed, and patch_transformers for code that only calls from_pretrained."""
import copy

import pytest
import torch

import fastbert
import fastbert.hf
from tests.helpers.families import PREFIX, batch, hf_config, labels_for

transformers = pytest.importorskip("transformers")

NAMES = [("xlm-roberta", "XLMRobertaForSequenceClassification"), ("roberta", "RobertaForMaskedLM"),
         ("electra", "ElectraModel"), ("camembert", "CamembertForTokenClassification"),
         ("distilbert", "DistilBertForSequenceClassification")]


def loaded(family, name, seed=0):
    torch.manual_seed(seed)
    return getattr(transformers, name)(hf_config(family, num_labels=3)).eval()


@pytest.mark.parametrize("family,name", NAMES)
def test_patch_keeps_outputs_and_parameters(family, name):
    model = loaded(family, name)
    plain = copy.deepcopy(model)
    params = list(model.parameters())
    keys = list(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    assert fastbert.patch(model) is model and fastbert.patch(model) is model
    assert list(model.parameters()) == params and all(a is b for a, b in zip(model.parameters(), params))
    assert list(model.state_dict()) == keys
    g = torch.Generator().manual_seed(1)
    ids, mask, _ = batch(family, 3, 10, g)
    real = mask.bool()

    def main_output(m, **kw):
        out = m(input_ids=ids, attention_mask=mask, **kw)
        value = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        return value[real] if value.shape[:2] == ids.shape else value

    with torch.no_grad():
        torch.testing.assert_close(main_output(model), main_output(plain), atol=2e-5, rtol=1e-4)
    if name.startswith(PREFIX[family] + "For"):  # a step of the optimizer built before the patch
        model.train()
        labels = labels_for(name, ids, mask, g)
        model(input_ids=ids, attention_mask=mask, **labels).loss.backward()
        opt.step()
        model.eval()
        moved = [n for (n, p), q in zip(model.named_parameters(), plain.parameters()) if not torch.equal(p, q)]
        assert moved, "the optimizer built before the patch did not change the weights"
        plain.load_state_dict(model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(main_output(model), main_output(plain), atol=2e-5, rtol=1e-4)


def test_patch_follows_train_and_eval():
    model = loaded("xlm-roberta", "XLMRobertaModel")
    fastbert.patch(model)
    fm = model.fastbert_model
    g = torch.Generator().manual_seed(2)
    ids, mask, _ = batch("xlm-roberta", 2, 8, g)
    model.train()
    model(input_ids=ids, attention_mask=mask)
    assert fm.training
    model.eval()
    model(input_ids=ids, attention_mask=mask)
    assert not fm.training


def test_patch_refuses_what_it_does_not_run():
    cfg = transformers.DebertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=48)
    with pytest.raises(TypeError, match="DebertaModel is not supported; supported: .*XLMRobertaModel"):
        fastbert.patch(transformers.DebertaModel(cfg))


def test_patch_transformers(tmp_path):
    loaded("xlm-roberta", "XLMRobertaForSequenceClassification").save_pretrained(tmp_path / "x")
    transformers.DebertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=48).save_pretrained(tmp_path / "d")
    transformers.DebertaModel(transformers.DebertaConfig.from_pretrained(tmp_path / "d")).save_pretrained(
        tmp_path / "d")
    try:
        fastbert.patch_transformers()
        fastbert.patch_transformers()
        model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "x")
        other = transformers.AutoModel.from_pretrained(tmp_path / "d")
    finally:
        fastbert.hf.unpatch_transformers()
    assert isinstance(model.fastbert_model, fastbert.XLMRobertaForSequenceClassification)
    assert getattr(other, "fastbert_model", None) is None
    plain = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "x")
    assert getattr(plain, "fastbert_model", None) is None
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits, atol=2e-5, rtol=1e-4)
