"""fastbert's BERT classes against transformers': outputs, losses and every parameter's gradient.

Random-weight configs (tiny on every backend; BERT-base shape on cpp and torch), batches with mixed
padding, compared at real tokens (fastbert leaves hidden states at padded positions undefined)."""
import pytest
import torch

from tests.helpers.backends import device_for
from tests.helpers.bert import HEADS, TINY, batch, compare, labels_for, pair

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=1000, hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def outputs(out, keys):
    return {k: out[k] for k in keys if getattr(out, k, None) is not None}


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("name", HEADS)
def test_heads_match_transformers(backend, name):
    dev = device_for(backend)
    hm, fm = pair(name, TINY)
    hm.to(dev), fm.to(dev).set_backend(backend)
    g = torch.Generator().manual_seed(1)
    ids, mask, tt = (t.to(dev) for t in batch(TINY["vocab_size"], 4, 13, g))
    extra = {k: v.to(dev) for k, v in labels_for(name, fm, ids, mask, g).items()}
    compare(name, hm, fm, ids, mask, tt, extra, torch.float32)


@pytest.mark.slow_with("triton")
def test_question_answering_loss_matches_transformers(backend):
    dev = device_for(backend)
    hm, fm = pair("BertForQuestionAnswering", TINY)
    hm.to(dev), fm.to(dev).set_backend(backend)
    g = torch.Generator().manual_seed(2)
    ids, mask, tt = (t.to(dev) for t in batch(TINY["vocab_size"], 3, 11, g, pad=False))
    extra = dict(start_positions=torch.tensor([1, 4, 20]).to(dev), end_positions=torch.tensor([2, 9, 3]).to(dev))
    compare("BertForQuestionAnswering", hm, fm, ids, mask, tt, extra, torch.float32)


@pytest.mark.parametrize("name", ["BertForPreTraining", "BertForSequenceClassification"])
def test_base_shape_matches_transformers(backend, name):
    if backend == "triton":
        pytest.skip("BERT-base shapes are checked on cpp and torch; the interpreter runs the tiny config")
    hm, fm = pair(name, BASE)
    fm.set_backend(backend)
    g = torch.Generator().manual_seed(3)
    ids, mask, tt = batch(BASE["vocab_size"], 3, 40, g)
    compare(name, hm, fm, ids, mask, tt, labels_for(name, fm, ids, mask, g), torch.float32)


def weighted_total(model, ids, mask, tt, extra, weights, fastbert_model):
    """Outputs at real tokens and a scalar (the loss plus random-weighted outputs) to backpropagate."""
    if fastbert_model:
        out = model(ids, mask, tt, **extra)
    else:
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, **extra)
    real = mask.bool()
    got, total = {}, 0.0
    for key in ("loss", "prediction_logits", "seq_relationship_logits"):
        a = out[key]
        if a.dim() >= 2 and tuple(a.shape[:2]) == tuple(ids.shape):
            a = a[real]
        got[key] = a
        total = total + (a.double() * weights[key]).sum()
    return got, total


@pytest.mark.slow_with("triton")
def test_half_precision_matches_transformers(backend):
    """fp16 outputs, loss and every parameter's gradient: fastbert's error against transformers in
    float64 is at most twice transformers' own fp16 error (plus the fp16 floor; STYLE.md lesson 4)."""
    import copy

    from tests.helpers.bounds import assert_within_bound

    dev = device_for(backend)
    name = "BertForPreTraining"
    hm, fm = pair(name, TINY)
    ref = copy.deepcopy(hm).double().to(dev)
    hm.half().to(dev)
    fm.half().to(dev).set_backend(backend)
    g = torch.Generator().manual_seed(4)
    ids, mask, tt = batch(TINY["vocab_size"], 4, 16, g)
    extra = labels_for(name, fm, ids, mask, g)
    ids, mask, tt = ids.to(dev), mask.to(dev), tt.to(dev)
    extra = {k: v.to(dev) for k, v in extra.items()}
    real = int(mask.sum())
    weights = {"loss": torch.tensor(1.0, dtype=torch.float64),
               "prediction_logits": torch.randn(real, TINY["vocab_size"], generator=g, dtype=torch.float64),
               "seq_relationship_logits": torch.randn(4, 2, generator=g, dtype=torch.float64)}
    weights = {k: v.to(dev) for k, v in weights.items()}
    results = []
    for model, is_fastbert in ((fm, True), (hm, False), (ref, False)):
        got, total = weighted_total(model, ids, mask, tt, extra, weights, is_fastbert)
        total.backward()
        results.append((got, dict(model.named_parameters())))
    (ours, ours_p), (theirs, theirs_p), (exact, exact_p) = results
    for key in ours:
        # fastbert's losses are computed (and returned) in fp32, transformers' in the model's dtype
        theirs_key = theirs[key].to(ours[key].dtype)
        assert_within_bound(f"fp16 {key}", ours[key], theirs_key, exact[key], torch.float16)
    for pname, p in ours_p.items():
        if theirs_p[pname].grad is None:
            assert p.grad is None or not p.grad.any(), f"fp16: gradient for {pname}, none in transformers"
            continue
        assert p.grad is not None, f"fp16: no gradient for {pname}"
        assert_within_bound(f"fp16 grad {pname}", p.grad, theirs_p[pname].grad, exact_p[pname].grad, torch.float16)


@pytest.mark.slow_with("triton")
def test_padded_and_packed_paths_agree(backend):
    dev = device_for(backend)
    _, fm = pair("BertForMaskedLM", TINY)
    fm.to(dev).set_backend(backend)
    g = torch.Generator().manual_seed(6)
    ids, mask, tt = (t.to(dev) for t in batch(TINY["vocab_size"], 4, 12, g))
    real = mask.bool()
    results = []
    for unpad in (True, False):
        fm.bert.unpad_inputs = unpad
        fm.zero_grad()
        out = fm(ids, mask, tt)
        (out.logits[real] ** 2).mean().backward()
        results.append((out.logits[real].detach(), {n: p.grad.clone() for n, p in fm.named_parameters()}))
    fm.bert.unpad_inputs = True
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    for n in results[0][1]:
        torch.testing.assert_close(results[0][1][n], results[1][1][n], atol=1e-5, rtol=1e-4, msg=n)


def test_all_padding_row_is_finite(backend):
    dev = device_for(backend)
    _, fm = pair("BertForPreTraining", TINY)
    fm.to(dev).set_backend(backend)
    ids = torch.randint(1, 90, (3, 8)).to(dev)
    mask = torch.ones(3, 8, dtype=torch.long).to(dev)
    mask[1] = 0
    out = fm(ids, mask)
    assert torch.isfinite(out.prediction_logits).all() and torch.isfinite(out.seq_relationship_logits).all()


@pytest.mark.slow_with("triton")
def test_training_mode_dropout_runs_and_is_seeded(backend):
    dev = device_for(backend)
    cfg = dict(TINY, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    _, fm = pair("BertForMaskedLM", cfg)
    fm.to(dev).set_backend(backend).train()
    g = torch.Generator().manual_seed(7)
    ids, mask, tt = (t.to(dev) for t in batch(TINY["vocab_size"], 3, 10, g))
    torch.manual_seed(0)
    a = fm(ids, mask, tt).logits
    torch.manual_seed(0)
    b = fm(ids, mask, tt).logits
    c = fm(ids, mask, tt).logits
    assert torch.equal(a, b) and not torch.equal(a, c)
    a.sum().backward()
