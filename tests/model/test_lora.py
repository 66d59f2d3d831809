"""Task adapters (fastbert.model.lora) on jina-embeddings-v3's original files: each task, chosen per
call or per row, against transformers' model with that task's update folded into its weights;
gradients into the adapters against the same update made differentiable; folding a task for good;
checkpoints with adapters both ways; the errors."""
import inspect
import warnings

import pytest
import torch

import fastbert
from tests.helpers.bert import TOL
from tests.helpers.jina import TASKS, OriginalJina

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    return OriginalJina(tmp_path_factory.mktemp("jina-v3"))


def batch(pad=True, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 120, (4, 11), generator=g)
    mask = torch.ones_like(ids)
    if pad:
        mask[1, 7:] = 0
        mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, 1), mask


def close(got, want, mask):
    torch.testing.assert_close(got.last_hidden_state[mask.bool()], want.last_hidden_state[mask.bool()],
                               **TOL[torch.float32])
    torch.testing.assert_close(got.pooler_output, want.pooler_output, **TOL[torch.float32])


def load(jina, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every tensor of the original files has its place
        return fastbert.AutoModel.from_pretrained(jina.path, **kw)


def test_the_original_files_load_and_each_task_is_its_folded_weights(jina):
    fm = load(jina)
    assert type(fm) is fastbert.JinaEmbeddingsV3Model and fm.config.tasks == TASKS
    assert fm.config.rope_theta == jina.config["rope_parameters"]["rope_theta"]
    for pad in (True, False):  # packed (varlen attention) and padded
        ids, mask = batch(pad)
        with torch.no_grad():
            close(fm(ids, attention_mask=mask), jina.base(ids, attention_mask=mask), mask)  # no task: no adapter
            for t, task in enumerate(TASKS):
                want = jina.folded(t)(ids, attention_mask=mask)
                close(fm(ids, attention_mask=mask, task=task), want, mask)
                close(fm(ids, attention_mask=mask, adapter_mask=torch.full((4,), t, dtype=torch.int32)), want, mask)
                assert not torch.allclose(want.pooler_output, jina.base(ids, attention_mask=mask).pooler_output)


@pytest.mark.parametrize("pad", [True, False])
def test_rows_of_different_tasks_in_one_batch(jina, pad):
    fm = load(jina)
    ids, mask = batch(pad)
    rows = [4, None, 1, 4]
    with torch.no_grad():
        by_name = fm(ids, attention_mask=mask, task=[None if t is None else TASKS[t] for t in rows])
        by_index = fm(ids, attention_mask=mask, adapter_mask=torch.tensor([4, 0, 1, 4]))
        for b, t in enumerate(rows):
            want = jina.folded(t)(ids[b:b + 1], attention_mask=mask[b:b + 1])
            real = mask[b].bool()
            torch.testing.assert_close(by_name.last_hidden_state[b][real], want.last_hidden_state[0][real],
                                       **TOL[torch.float32])
            torch.testing.assert_close(by_name.pooler_output[b], want.pooler_output[0], **TOL[torch.float32])
        for b in (0, 2, 3):  # the same tasks by index
            torch.testing.assert_close(by_index.pooler_output[b], by_name.pooler_output[b])


def test_gradients_reach_the_adapters_as_through_the_folded_weights(jina):
    """The loss's gradient with respect to every lora_A and lora_B (and a plain weight) against
    transformers' model run on W + scaling * B[t] @ A[t] made from the same tensors under autograd,
    rows of two tasks and one without in the batch."""
    fm = load(jina).train()
    fm.config.hidden_dropout_prob = 0.0
    ids, mask = batch(True)
    rows = [2, 0, None, 2]
    g = torch.Generator().manual_seed(5)
    weights = torch.randn(4, 11, 64, generator=g)
    out = fm(ids, attention_mask=mask, task=[None if t is None else TASKS[t] for t in rows])
    ((out.last_hidden_state * mask[..., None]) * weights).sum().backward()

    hm = jina.base
    adapters = {k: (a.clone().requires_grad_(), b.clone().requires_grad_(), emb)
                for k, (a, b, emb) in jina.updates.items()}
    names = dict(hm.named_parameters())
    total = 0
    for t in (2, 0, None):
        params = {}
        for key, (a, b, emb) in adapters.items():
            if t is None:
                continue
            w = jina.state[key] + (a[t] @ b[t] if emb else b[t] @ a[t]) * 0.25
            if "mixer.Wqkv" in key:
                layer = key.split(".")[2]
                for part, chunk in zip(("q_proj", "k_proj", "v_proj"), w.chunk(3)):
                    params[f"layers.{layer}.self_attn.{part}.weight"] = chunk
            else:
                name = (key.replace("encoder.layers.", "layers.").replace("mixer.out_proj", "self_attn.o_proj"))
                assert name in names, name
                params[name] = w
        sel = [b for b, r in enumerate(rows) if r == t]
        ref = torch.func.functional_call(hm, params, (ids[sel],), {"attention_mask": mask[sel]}, strict=False)
        total = total + ((ref.last_hidden_state * mask[sel][..., None]) * weights[sel]).sum()
    total.backward()
    base = fm.base_model
    theirs = {
        "embeddings.word_embeddings.weight": base.embeddings.lora["word_embeddings"],
        "encoder.layers.0.mixer.Wqkv.weight": base.layers[0].lora["qkv"],
        "encoder.layers.1.mixer.out_proj.weight": base.layers[1].lora["attention_output"],
        "encoder.layers.0.mlp.fc1.weight": base.layers[0].lora["ffn_input"],
        "encoder.layers.1.mlp.fc2.weight": base.layers[1].lora["ffn_output"],
    }
    for key, module in theirs.items():
        a, b, _ = adapters[key]
        for mine, want in ((module.lora_A.grad, a.grad), (module.lora_B.grad, b.grad)):
            assert want[1].abs().sum() == 0 and mine[1].abs().sum() == 0  # no row ran task 1
            torch.testing.assert_close(mine, want, atol=2e-4, rtol=2e-3)


def test_a_folded_task_is_the_per_call_task_on_every_route(jina, tmp_path):
    ids, mask = batch(True)
    per_call = load(jina)
    folded = load(jina, task="separation")
    assert folded.config.folded_task == "separation" and folded.config.tasks == []
    assert not any("lora" in name for name, _ in folded.named_parameters())
    with torch.no_grad():
        want = per_call(ids, attention_mask=mask, task="separation")
        close(folded(ids, attention_mask=mask), want, mask)
        with pytest.raises(ValueError, match="no task adapters"):
            folded(ids, attention_mask=mask, task="separation")
        folded.save_pretrained(str(tmp_path / "folded"))  # a plain checkpoint: transformers runs the task
        hm = transformers.JinaEmbeddingsV3Model.from_pretrained(str(tmp_path / "folded")).eval()
        close(hm(ids, attention_mask=mask), want, mask)
        q = fastbert.AutoModel.from_pretrained(jina.path, task="separation", quantize="int8")
        assert q.quantized == "int8"
        got = q(ids, attention_mask=mask).last_hidden_state[mask.bool()]
        err = (got - want.last_hidden_state[mask.bool()]).abs().max() / want.last_hidden_state.abs().max()
        assert err < 0.05, err


def test_a_checkpoint_with_adapters_both_ways(jina, tmp_path):
    """fastbert writes the plain weights under transformers' names and the adapters under the
    original model's: fastbert reads every task back; transformers reads the encoder (no adapter)."""
    from safetensors.torch import load_file

    fm = load(jina)
    fm.save_pretrained(str(tmp_path / "saved"))
    keys = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert "encoder.layers.0.mixer.Wqkv.weight" in keys
    assert "encoder.layers.0.mixer.Wqkv.parametrizations.weight.0.lora_A" in keys
    assert not any(k.endswith("parametrizations.weight.original") for k in keys)
    again = fastbert.JinaEmbeddingsV3Model.from_pretrained(str(tmp_path / "saved"))
    ids, mask = batch(True)
    with torch.no_grad():
        for task in (None, "retrieval.query"):
            close(again(ids, attention_mask=mask, task=task), fm(ids, attention_mask=mask, task=task), mask)
        hm = transformers.JinaEmbeddingsV3Model.from_pretrained(str(tmp_path / "saved")).eval()
        close(hm(ids, attention_mask=mask), fm(ids, attention_mask=mask), mask)


def test_heads_take_the_task_and_the_trainer_sees_their_arguments(jina):
    cls = fastbert.AutoModelForSequenceClassification
    per_call = cls.from_pretrained(jina.path, num_labels=3)
    folded = cls.from_pretrained(jina.path, num_labels=3, task="classification")
    folded.classifier.load_state_dict(per_call.classifier.state_dict())
    ids, mask = batch(True)
    with torch.no_grad():
        torch.testing.assert_close(per_call(ids, attention_mask=mask, task="classification").logits,
                                   folded(ids, attention_mask=mask).logits, **TOL[torch.float32])
    params = inspect.signature(per_call.forward).parameters
    assert {"input_ids", "attention_mask", "labels", "task", "adapter_mask"} <= set(params)


def test_clear_errors(jina):
    fm = load(jina)
    ids, mask = batch(True)
    with pytest.raises(ValueError, match="unknown task 'query'; this model's tasks: retrieval.query"):
        fm(ids, attention_mask=mask, task="query")
    with pytest.raises(ValueError, match="task= or adapter_mask=, not both"):
        fm(ids, attention_mask=mask, task="separation", adapter_mask=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="outside 0..4"):
        fm(ids, attention_mask=mask, adapter_mask=torch.tensor([0, 1, 5, 0]))
    with pytest.raises(ValueError, match="3 entries for a batch of 4"):
        fm(ids, attention_mask=mask, task=["separation"] * 3)
    with pytest.raises(ValueError, match="unknown task 'x'"):
        fm.fold_task("x")
    fm.quantize_("int8")
    with pytest.raises(RuntimeError, match="fold one task before quantizing"):
        fm(ids, attention_mask=mask, task="separation")
    with pytest.raises(RuntimeError, match="fold a task before quantizing"):
        fm.fold_task("separation")
