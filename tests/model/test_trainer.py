"""fastbert models under transformers.Trainer (train, evaluate, save_model with processing_class and
DataCollatorWithPadding; the saved directory reloads in transformers with the same logits), the
PreTrainedModel methods scripts call, and gradient checkpointing that really recomputes."""
import pytest
import torch

import fastbert
from tests.helpers.fine_tuning import TINY, sentiment_rows

transformers = pytest.importorskip("transformers")


def test_trainer_trains_evaluates_and_saves_a_model_transformers_loads(tokenizer, tmp_path):
    torch.manual_seed(0)
    config = fastbert.BertConfig(vocab_size=len(tokenizer), num_labels=2, **TINY)
    model = fastbert.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=16, per_device_eval_batch_size=32,
        learning_rate=3e-3, warmup_steps=5, max_steps=60, logging_steps=20, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True)

    def accuracy(pred):
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=sentiment_rows(tokenizer, 640, 1),
        eval_dataset=sentiment_rows(tokenizer, 200, 2), processing_class=tokenizer,
        data_collator=transformers.DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
    result = trainer.train()
    metrics = trainer.evaluate()
    assert result.training_loss < 0.69 and metrics["eval_accuracy"] > 0.8, (result, metrics)

    out = str(tmp_path / "saved")
    trainer.save_model(out)
    theirs = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    batch = transformers.DataCollatorWithPadding(tokenizer)(sentiment_rows(tokenizer, 8, 3))
    batch.pop("labels")
    model.eval()
    with torch.no_grad():
        ours = model(**batch).logits
        ref = theirs(**batch).logits
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    assert fastbert.BertForSequenceClassification.from_pretrained(out).config.num_labels == 2
    assert transformers.AutoTokenizer.from_pretrained(out)("good movie")["input_ids"] == tokenizer("good movie")["input_ids"]


def test_model_methods_scripts_call():
    torch.manual_seed(0)
    model = fastbert.BertForMaskedLM(fastbert.BertConfig(vocab_size=50, **TINY))
    hf = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=50, **TINY))
    assert model.num_parameters() == hf.num_parameters()
    assert model.num_parameters(exclude_embeddings=True) == hf.num_parameters(exclude_embeddings=True)
    assert model.base_model is model.bert and model.get_input_embeddings() is model.bert.embeddings.word_embeddings
    emb = model.resize_token_embeddings(61, pad_to_multiple_of=8)
    assert emb.num_embeddings == 64 and model.config.vocab_size == 64
    assert model.get_output_embeddings().weight is emb.weight  # still tied
    ids = torch.randint(0, 64, (2, 7))
    assert model(ids).logits.shape == (2, 7, 64)
    assert model.floating_point_ops({"input_ids": ids}) == 6 * 14 * model.num_parameters(exclude_embeddings=True)
    assert model.config.get_text_config() is model.config and model.main_input_name == "input_ids"


def _saved_activation_bytes(model, ids, mask):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, mask).last_hidden_state.square().mean()
    return loss, total


def test_gradient_checkpointing_recomputes_and_saves_memory():
    torch.manual_seed(0)
    cfg = fastbert.BertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                              intermediate_size=256, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = fastbert.BertModel(cfg).train()
    ids = torch.randint(1, 97, (4, 32))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    calls = []
    for layer in model.encoder.layer:
        def counted(*args, forward=layer.forward, **kwargs):
            calls.append(1)
            return forward(*args, **kwargs)

        layer.forward = counted

    torch.manual_seed(1)
    loss, plain_bytes = _saved_activation_bytes(model, ids, mask)
    loss.backward()
    plain_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    assert len(calls) == 4

    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    calls.clear()
    torch.manual_seed(1)
    loss_ckpt, ckpt_bytes = _saved_activation_bytes(model, ids, mask)
    loss_ckpt.backward()
    assert len(calls) == 8  # every layer ran again in the backward
    assert ckpt_bytes < plain_bytes / 3, (ckpt_bytes, plain_bytes)
    torch.testing.assert_close(loss_ckpt, loss)  # the same dropout masks
    for n, p in model.named_parameters():
        if n in plain_grads:
            torch.testing.assert_close(p.grad, plain_grads[n], rtol=1e-5, atol=1e-6)
    print(f"saved activations: {plain_bytes / 2**20:.2f} MiB without, {ckpt_bytes / 2**20:.2f} MiB with checkpointing")


def test_trainer_still_saves_transformers_models_its_own_way(tokenizer, tmp_path):
    torch.manual_seed(0)
    fastbert.BertModel(fastbert.BertConfig(vocab_size=50, **TINY))  # a fastbert model exists: Trainer is patched
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=len(tokenizer), **TINY))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True)
    trainer = transformers.Trainer(model=hf, args=args, processing_class=tokenizer)
    trainer.save_model(str(tmp_path / "hf"))
    back = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "hf"))
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), hf.state_dict().values()))
