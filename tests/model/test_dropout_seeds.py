"""A layer's dropouts take their seeds from one draw of torch's RNG per layer call
(fastbert.ops.common.DropoutSeeds): torch.manual_seed repeats a training step exactly, the seeds
differ from layer to layer and step to step, and gradient checkpointing, whose recomputation
restores the RNG, redraws the same masks (so its gradients are the plain backward's)."""
import copy

import pytest
import torch

import fastbert
from fastbert.ops.common import DropoutSeeds
from fastbert.reference import new_seed
from tests.helpers.backends import device_for

CFG = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
           max_position_embeddings=64, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)


def test_one_draw_per_layer_call_and_none_without_dropout():
    torch.manual_seed(3)
    state = torch.get_rng_state()
    seeds = DropoutSeeds()
    assert seeds.take(0.0) is None
    assert torch.equal(torch.get_rng_state(), state), "no dropout, yet torch's RNG moved"
    taken = [seeds.take(0.1) for _ in range(5)]
    after_one = torch.get_rng_state()
    torch.set_rng_state(state)
    new_seed()
    assert torch.equal(after_one, torch.get_rng_state()), "five seeds were not one draw of torch's RNG"
    assert len(set(taken)) == 5 and all(0 <= s < 2**63 for s in taken)
    torch.set_rng_state(state)
    again = DropoutSeeds()
    assert [again.take(0.1) for _ in range(5)] == taken, "the same RNG state gave other seeds"
    generator = torch.Generator().manual_seed(7)
    mine = DropoutSeeds(generator)
    before = torch.get_rng_state()
    mine.take(0.5)
    assert torch.equal(torch.get_rng_state(), before), "a generator was given, yet torch's global RNG moved"


def _model(backend):
    torch.manual_seed(0)
    model = fastbert.BertModel(fastbert.BertConfig(**CFG), add_pooling_layer=False).train()
    return model.to(device_for(backend)).set_backend(backend)


def _batch(backend):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 97, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 4:] = 0
    device = device_for(backend)
    return ids.to(device), mask.to(device)


def _step(model, ids, mask, seed):
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow_with("triton")
def test_manual_seed_repeats_a_step_and_another_seed_changes_it(backend):
    model = _model(backend)
    ids, mask = _batch(backend)
    out, grads = _step(model, ids, mask, 11)
    again, grads_again = _step(model, ids, mask, 11)
    assert torch.equal(out, again)
    assert all(torch.equal(grads[n], grads_again[n]) for n in grads)
    other, _ = _step(model, ids, mask, 12)
    assert not torch.equal(out, other), "another seed, the same dropout"
    model.eval()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.equal(out, plain), "training mode dropped nothing"


@pytest.mark.slow_with("triton")
def test_gradient_checkpointing_recomputes_the_same_masks(backend):
    plain = _model(backend)
    checkpointed = copy.deepcopy(plain)
    checkpointed.gradient_checkpointing_enable()
    ids, mask = _batch(backend)
    out, grads = _step(plain, ids, mask, 5)
    out_c, grads_c = _step(checkpointed, ids, mask, 5)
    torch.testing.assert_close(out_c, out, rtol=0, atol=0)
    assert grads.keys() == grads_c.keys() and grads
    for name in grads:
        # the recomputed forward is the same arithmetic; only the order of the gradients' sums may differ
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)
