"""The pretraining loss is transformers' BertForPreTraining loss; a few steps on a fixed batch lower it."""
import numpy as np
import pytest
import torch

import fastbert
from fastbert.data.pretraining_shards import InstanceDataset
from fastbert.pretraining.batches import BatchPlan, features, make_collator
from fastbert.pretraining.objective import PretrainingObjective, summarize
from fastbert.pretraining.schedule import linear_schedule, param_groups


def _model_and_batch(tiny_data, seed=0):
    ds = InstanceDataset(tiny_data, "train")
    torch.manual_seed(seed)
    config = fastbert.BertConfig(vocab_size=ds.index["vocab_size"], hidden_size=48, num_hidden_layers=2,
                                 num_attention_heads=3, intermediate_size=96, max_position_embeddings=64)
    model = fastbert.BertForPreTraining(config)
    rows = [ds[i] for i in range(seed, seed + 12)]
    for r in (0, 5):  # shorter pairs, so the batch has padding
        ids, a_len, label = rows[r]
        rows[r] = (np.concatenate([ids[:12 + r], ids[-1:]]), min(a_len, 12 + r), label)
    collator = make_collator(ds.index)
    collator.generator.manual_seed(seed)
    batch = collator(features(rows))
    assert (batch["attention_mask"] == 0).any() and (batch["labels"] != -100).any()
    return model, batch


def transformers_twin(model):
    """transformers' BertForPreTraining with model's configuration and weights (its decoder tied
    again after the load); both left in eval mode."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(**{k: v for k, v in model.config.to_dict().items() if k not in ("architectures", "dtype")})
    hf = transformers.BertForPreTraining(cfg)
    hf.load_state_dict(model.state_dict(), strict=False)
    hf.tie_weights()
    hf.eval()
    model.eval()
    return hf


def test_loss_equals_transformers(tiny_data):
    model, batch = _model_and_batch(tiny_data)
    hf = transformers_twin(model)
    with torch.no_grad():
        want = hf(**batch).loss.double()
        got_model = model(**batch).loss.double()
        got_objective, stats = PretrainingObjective(model)(**batch)
    assert torch.allclose(got_model, want, rtol=1e-5, atol=1e-5), (got_model, want)
    assert torch.allclose(got_objective.double(), want, rtol=1e-5, atol=1e-5), (got_objective, want)
    m = summarize(stats)
    assert m["masked_tokens"] == int((batch["labels"] != -100).sum())
    assert m["pairs"] == batch["input_ids"].shape[0]
    assert abs(m["loss"] - want.item()) < 1e-4


def test_gradients_match_transformers(tiny_data):
    model, batch = _model_and_batch(tiny_data, seed=1)
    hf = transformers_twin(model)
    hf(**batch).loss.backward()
    PretrainingObjective(model)(**batch)[0].backward()
    hf_grads = dict(hf.named_parameters())
    for name, p in model.named_parameters():
        g, want = p.grad, hf_grads[name].grad
        assert torch.allclose(g, want, rtol=1e-3, atol=1e-5 * max(1.0, want.abs().max().item())), name


def test_a_few_steps_lower_the_loss_on_a_fixed_batch(tiny_data):
    model, batch = _model_and_batch(tiny_data, seed=2)
    model.train()
    objective = PretrainingObjective(model)
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=3e-3, betas=(0.9, 0.999), eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_schedule(2, 15))
    losses = []
    for _ in range(15):
        loss, _ = objective(**batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_no_weight_decay_on_biases_and_layer_norm(tiny_data):
    model, _ = _model_and_batch(tiny_data)
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(not names[id(p)].endswith("bias") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_linear_schedule():
    f = linear_schedule(4, 10)
    assert [round(f(s), 4) for s in range(11)] == [0.25, 0.5, 0.75, 1.0, 1.0, 0.8333, 0.6667, 0.5, 0.3333, 0.1667, 0.0]


def test_masks_change_every_epoch_and_repeat_on_request(tiny_data):
    ds = InstanceDataset(tiny_data, "train")
    plan = BatchPlan(ds, make_collator(ds.index), batch_size=4, seed=0)
    a, b = plan.batch(0), plan.batch(0)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the same pairs in a later epoch get other masks
    e0 = plan.indices(0)
    m = next(m for m in range(plan.per_epoch, 2 * plan.per_epoch) if set(plan.indices(m)) & set(e0))
    assert set(plan.indices(m)) != set(e0) or not torch.equal(plan.batch(m)["labels"], a["labels"])
    # two processes read disjoint blocks of each global batch
    p0 = BatchPlan(ds, make_collator(ds.index), batch_size=4, seed=0, rank=0, world_size=2)
    p1 = BatchPlan(ds, make_collator(ds.index), batch_size=4, seed=0, rank=1, world_size=2)
    for step in range(3):
        assert not set(p0.indices(step)) & set(p1.indices(step))
        assert sorted(list(p0.indices(step)) + list(p1.indices(step))) == sorted(
            BatchPlan(ds, make_collator(ds.index), batch_size=8, seed=0).indices(step))
