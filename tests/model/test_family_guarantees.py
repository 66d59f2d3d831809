"""What the BERT classes guarantee, for the other families: torch.compile(fullgraph=True) like eager,
bf16 autocast within the bound of transformers' own, int8 inference close to fp32 with
transformers' state dict, transformers.Trainer training and saving a directory transformers loads."""
import copy

import pytest
import torch

import fastbert
from tests.helpers.autocast import BF16, run
from tests.helpers.backends import require
from tests.helpers.bounds import assert_within_bound
from tests.helpers.families import CONFIGS, PREFIX, batch, labels_for, pair
from tests.helpers.fine_tuning import TINY as TRAINER_TINY
from tests.helpers.fine_tuning import sentiment_rows
from tests.helpers.profiles import fastbert_op_counts

transformers = pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize("family,name", [("xlm-roberta", "XLMRobertaForSequenceClassification"),
                                         ("electra", "ElectraForMaskedLM"), ("gte", "GteForSequenceClassification")])
def test_torch_compile_fullgraph_like_eager(family, name):
    _, model = pair(family, name)
    g = torch.Generator().manual_seed(3)
    ids, mask, tt = batch(family, 3, 12, g)
    labels = labels_for(name, ids, mask, g)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (model, compiled):
        model.zero_grad()
        model.train()
        loss = fn(input_ids=ids, attention_mask=mask, **labels).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.eval()
        with torch.no_grad():
            results.append((loss.detach(), grads, fn(input_ids=ids, attention_mask=mask).logits))
    (loss_e, g_e, out_e), (loss_c, g_c, out_c) = results
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    if out_e.shape[:2] == ids.shape:  # per token: padded positions are not defined
        out_e, out_c = out_e[mask.bool()], out_c[mask.bool()]
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
    assert g_e.keys() == g_c.keys()
    for n in g_e:
        torch.testing.assert_close(g_c[n], g_e[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("family,name", [("xlm-roberta", "XLMRobertaForMaskedLM"),
                                         ("electra", "ElectraForSequenceClassification"), ("gte", "GteForMaskedLM")])
def test_bf16_autocast_within_transformers_bound(family, name):
    require("cpp")
    hm, fm = pair(family, name)
    exact = copy.deepcopy(hm).double()
    for m in (hm, fm, exact):
        m.train()
    g = torch.Generator().manual_seed(7)
    ids, mask, tt = batch(family, 4, 16, g)
    extra = labels_for(name, ids, mask, g)
    weights = {}
    ours, ours_p = run(fm, True, ids, mask, tt, extra, weights, autocast=True)
    theirs, theirs_p = run(hm, False, ids, mask, tt, extra, weights, autocast=True)
    ref, ref_p = run(exact, False, ids, mask, tt, extra, weights, autocast=False)
    theirs_p, ref_p = (dict(m.named_parameters(remove_duplicate=False)) for m in (hm, exact))  # tied: either name
    assert set(ours) == set(theirs)
    for key in ours:
        assert_within_bound(f"{name} autocast {key}", ours[key], theirs[key], ref[key], BF16)
    for pname, p in ours_p.items():
        if theirs_p[pname].grad is not None:
            assert_within_bound(f"{name} autocast grad {pname}", p.grad.float(), theirs_p[pname].grad.float(),
                                ref_p[pname].grad, BF16)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_int8_close_to_fp32_with_transformers_state_dict(family, tmp_path):
    require("cpp")
    name = PREFIX[family] + "Model"
    hm, fp32 = pair(family, name, tmp_path / "hf")
    int8 = getattr(fastbert, name).from_pretrained(str(tmp_path / "hf"), quantize="int8")
    assert list(int8.state_dict()) == list(fp32.state_dict())
    g = torch.Generator().manual_seed(5)
    ids, mask, _ = batch(family, 4, 16, g)
    real = mask.bool()
    with torch.no_grad():
        a = int8(input_ids=ids, attention_mask=mask).last_hidden_state[real]
        b = fp32(input_ids=ids, attention_mask=mask).last_hidden_state[real]
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    assert cos.min() > 0.99, f"{family}: lowest cosine {cos.min():.4f}"
    int8.save_pretrained(str(tmp_path / "int8"))
    back = getattr(transformers, name).from_pretrained(str(tmp_path / "int8")).eval()
    with torch.no_grad():
        c = back(input_ids=ids, attention_mask=mask).last_hidden_state[real]
    assert torch.nn.functional.cosine_similarity(c, b, dim=-1).min() > 0.99


@pytest.mark.parametrize("family", ["gte", "nomic_bert"])
def test_int8_gated_feed_forward_is_one_fused_pass_per_layer(family):
    """int8 with a gated feed-forward (GeGLU, SwiGLU): in each layer the gate and up products'
    dequantization, act(gate) * up and its quantization are one int8_glu; only the QKV product is
    dequantized into a float tensor."""
    require("cpp")
    name = PREFIX[family] + "Model"
    _, model = pair(family, name)
    model.quantize_("int8")
    ids, mask, _ = batch(family, 3, 12, torch.Generator().manual_seed(2))
    with torch.no_grad():
        counts = fastbert_op_counts(lambda: model(input_ids=ids, attention_mask=mask))
    layers = model.config.num_hidden_layers
    # on a packed weight each is one op with its product (int8_packed_glu, int8_packed_dequantize)
    glu, dequantize = (counts[f"int8_{n}"] + counts[f"int8_packed_{n}"] for n in ("glu", "dequantize"))
    assert glu == layers and dequantize == layers, counts


@pytest.mark.slow
def test_trainer_trains_xlm_roberta_and_saves_what_transformers_loads(tokenizer, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    config = fastbert.XLMRobertaConfig(vocab_size=len(tokenizer), num_labels=2, pad_token_id=0, type_vocab_size=1,
                                       **dict(TRAINER_TINY, max_position_embeddings=66))
    model = fastbert.XLMRobertaForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=16, learning_rate=3e-3, warmup_steps=5,
        max_steps=60, save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    rows = [{k: v for k, v in r.items() if k != "token_type_ids"} for r in sentiment_rows(tokenizer, 640, 1)]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer))
    assert trainer.train().training_loss < 0.69
    trainer.save_model(str(tmp_path / "saved"))
    theirs = transformers.XLMRobertaForSequenceClassification.from_pretrained(str(tmp_path / "saved")).eval()
    test = transformers.DataCollatorWithPadding(tokenizer)(
        [{k: v for k, v in r.items() if k not in ("token_type_ids", "label")} for r in sentiment_rows(tokenizer, 8, 3)])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**test).logits, theirs(**test).logits, rtol=1e-4, atol=1e-5)
