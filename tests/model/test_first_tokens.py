"""BertForSequenceClassification's last layer at the [CLS] token alone (BertLayer.first_tokens):
the same logits, loss and every parameter's gradient as the layer on every token, on the packed
and the padded paths; the full layer whenever an output needs every token."""
import copy

import pytest
import torch

import fastbert
from fastbert.model.layers import BertLayer
from tests.helpers.backends import device_for

CFG = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
           max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)


@pytest.fixture
def first_token_calls(monkeypatch):
    """How many times BertLayer.first_tokens ran (a list whose length counts the calls)."""
    calls = []
    original = BertLayer.first_tokens

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BertLayer, "first_tokens", counted)
    return calls


def models(backend, seed=0):
    torch.manual_seed(seed)
    ours = fastbert.BertForSequenceClassification(fastbert.BertConfig(**CFG)).train()
    ours.to(device_for(backend)).set_backend(backend)
    every = copy.deepcopy(ours)
    every.pooled_only = False
    return ours, every


def inputs(backend, bsz=4, seq=11, pad=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, CFG["vocab_size"], (bsz, seq), generator=g)
    mask = torch.ones(bsz, seq, dtype=torch.long)
    if pad:
        for b in range(1, bsz):
            mask[b, int(torch.randint(1, seq, (1,), generator=g)):] = 0
    labels = torch.randint(0, CFG["num_labels"], (bsz,), generator=g)
    dev = device_for(backend)
    return dict(input_ids=(ids * mask).to(dev), attention_mask=mask.to(dev), labels=labels.to(dev))


def run(model, batch, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(**batch, **kwargs)
    (out.loss + (out.logits * torch.linspace(-1, 1, out.logits.numel()).view_as(out.logits)).sum()).backward()
    return out, {n: p.grad for n, p in model.named_parameters()}


def assert_same(a, b):
    tol = dict(atol=1e-5, rtol=1e-4)
    (out_a, grads_a), (out_b, grads_b) = a, b
    torch.testing.assert_close(out_a.logits, out_b.logits, **tol)
    torch.testing.assert_close(out_a.loss, out_b.loss, **tol)
    for name, g in grads_b.items():
        if g is None:
            assert grads_a[name] is None or not grads_a[name].any(), name
            continue
        scale = max(1.0, g.abs().max().item())
        torch.testing.assert_close(grads_a[name] / scale, g / scale, **tol, msg=name)


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("pad", [True, False], ids=["packed", "padded"])
def test_first_tokens_match_every_token(backend, first_token_calls, pad):
    ours, every = models(backend)
    batch = inputs(backend, pad=pad)
    head_mask = torch.ones(CFG["num_hidden_layers"], CFG["num_attention_heads"], device=batch["input_ids"].device)
    head_mask[-1, 1] = 0.0
    for kwargs in ({}, dict(head_mask=head_mask)):
        got = run(ours, batch, **kwargs)
        assert len(first_token_calls) == 1, "the last layer did not run at the first tokens"
        assert_same(got, run(every, batch, **kwargs))
        assert len(first_token_calls) == 1
        first_token_calls.clear()


@pytest.mark.slow_with("triton")
def test_first_tokens_under_gradient_checkpointing(backend, first_token_calls):
    ours, every = models(backend)
    ours.gradient_checkpointing_enable()
    batch = inputs(backend)
    assert_same(run(ours, batch), run(every, batch))
    assert len(first_token_calls) == 2  # the forward, and its recomputation in the backward


@pytest.mark.slow_with("triton")
def test_outputs_that_need_every_token_run_the_full_layer(backend, first_token_calls):
    ours, every = models(backend)
    batch = inputs(backend)
    out = ours(**batch, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == CFG["num_hidden_layers"] + 1
    assert out.hidden_states[-1].shape == batch["input_ids"].shape + (CFG["hidden_size"],)
    assert len(out.attentions) == CFG["num_hidden_layers"]
    left = dict(batch, attention_mask=batch["attention_mask"].flip(1), input_ids=batch["input_ids"].flip(1))
    assert_same(run(ours, left), run(every, left))
    assert not first_token_calls
    hidden = ours.bert(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    assert hidden.shape == batch["input_ids"].shape + (CFG["hidden_size"],)  # BertModel alone: every token
    assert not first_token_calls


def test_first_tokens_under_bf16_autocast(first_token_calls):
    ours, every = models(None)  # the automatic backend
    batch = inputs(None, seq=24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = ours(**batch).logits, every(**batch).logits
    assert len(first_token_calls) == 1
    torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)
