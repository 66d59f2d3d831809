"""XLM-RoBERTa-shaped pretraining: `prepare --model-type xlm-roberta` (a sentencepiece Unigram
vocabulary with XLM-R's special tokens, single segments, no NSP), the MLM loss and gradients equal to
transformers' XLMRobertaForMaskedLM, and `fastbert pretrain --model-type xlm-roberta` on Korean text
whose output transformers loads, model and tokenizer."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastbert
from fastbert.data.prepare import prepare_data
from fastbert.data.pretraining_shards import InstanceDataset
from fastbert.pretraining.batches import BatchPlan, make_collator
from fastbert.pretraining.objective import PretrainingObjective, summarize
from tests.helpers.korean_text import DOCUMENTS
from tests.helpers.pretraining import TINY_ARGS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def xlmr_data(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("xlmr_data"))
    prepare_data(out, documents=lambda: iter(DOCUMENTS * 4), model_type="xlm-roberta", vocab_size=300,
                 max_seq_length=24, dupe_factor=2, eval_fraction=0.2, progress=False, log=lambda *a: None)
    return out


def test_prepared_sequences_are_single_segments_in_xlm_r_form(xlmr_data):
    ds = InstanceDataset(xlmr_data, "train")
    index = ds.index
    assert index["model_type"] == "xlm-roberta" and index["next_sentence"] is False
    special = index["special_tokens"]
    assert (special["[CLS]"], special["[PAD]"], special["[SEP]"], special["[UNK]"]) == (0, 1, 2, 3)
    assert special["[MASK]"] == index["vocab_size"] - 1
    assert len(ds) > 10
    for i in range(len(ds)):
        ids, a_len, label = ds[i]
        assert ids[0] == 0 and ids[-1] == 2 and len(ids) <= 24
        assert not np.isin(ids[1:-1], [0, 1, 2, special["[MASK]"]]).any()  # one segment, no pair separator
        assert a_len == len(ids) and label == 0  # token types all 0
    tok = transformers.AutoTokenizer.from_pretrained(xlmr_data)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<s>", "<pad>", "</s>", "<unk>"]


def _pair(data, seed=0):
    ds = InstanceDataset(data, "train")
    torch.manual_seed(seed)
    config = fastbert.XLMRobertaConfig(vocab_size=ds.index["vocab_size"], hidden_size=48, num_hidden_layers=2,
                                       num_attention_heads=3, intermediate_size=96, max_position_embeddings=40,
                                       type_vocab_size=1, pad_token_id=1, hidden_dropout_prob=0.0,
                                       attention_probs_dropout_prob=0.0)
    ours = fastbert.XLMRobertaForMaskedLM(config).eval()
    theirs = transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(**config.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict(), strict=False)
    theirs.tie_weights()
    plan = BatchPlan(ds, make_collator(ds.index), batch_size=8, seed=seed)
    batch = next(b for b in map(plan.batch, range(plan.per_epoch)) if (b["attention_mask"] == 0).any())
    return ours, theirs, batch


def test_mlm_loss_and_gradients_equal_transformers(xlmr_data):
    ours, theirs, batch = _pair(xlmr_data)
    assert (batch["token_type_ids"] == 0).all()
    hf_batch = {k: v for k, v in batch.items() if k != "next_sentence_label"}
    want = theirs(**hf_batch).loss
    loss, stats = PretrainingObjective(ours)(**batch)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    m = summarize(stats)
    assert "nsp_loss" not in m and m["pairs"] == batch["input_ids"].shape[0]
    assert m["masked_tokens"] == int((batch["labels"] != -100).sum()) > 0
    want.backward()
    loss.backward()
    hf_grads = dict(theirs.named_parameters(remove_duplicate=False))
    for name, p in ours.named_parameters():
        g = hf_grads[name].grad
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-5 * max(1.0, g.abs().max().item()), msg=name)


def test_pretrain_xlm_roberta_on_korean_then_load_in_transformers(tmp_path, capsys):
    from fastbert import cli
    from fastbert.data.corpus import write_documents

    corpus = str(tmp_path / "ko.txt")
    write_documents(DOCUMENTS * 5, corpus)
    out = str(tmp_path / "run")
    args = [a if a != "300" else "400" for a in TINY_ARGS]
    assert cli.main(["pretrain", "--corpus", corpus, "--out", out, "--model-type", "xlm-roberta", "--max-steps", "3",
                     "--whole-word-mask", *args]) == 0
    printed = capsys.readouterr().out
    assert "XLMRobertaForMaskedLM" in printed and "sequences (train)" in printed and "MLM accuracy" in printed
    assert "NSP" not in printed
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["model_type"] == "xlm-roberta" and config["architectures"] == ["XLMRobertaForMaskedLM"]
    assert config["pad_token_id"] == 1 and config["type_vocab_size"] == 1 and config["max_position_embeddings"] == 66
    assert not os.path.exists(os.path.join(out, "vocab.txt"))

    tok = transformers.AutoTokenizer.from_pretrained(out)
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    ours = fastbert.AutoModelForMaskedLM.from_pretrained(out)
    assert type(ours) is fastbert.XLMRobertaForMaskedLM
    enc = tok([DOCUMENTS[0][0], "한국어 문장"], padding=True, return_tensors="pt")
    assert tok.unk_token_id not in enc["input_ids"][0].tolist()
    with torch.no_grad():
        a, b = ours(**enc).logits, theirs(**enc).logits
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(a[real], b[real], atol=1e-4, rtol=1e-4)
    assert tok.decode(enc["input_ids"][0], skip_special_tokens=True) == DOCUMENTS[0][0]


def _prepare_in_a_process(corpus, out, model_type, hash_seed):
    code = ("import sys; from fastbert.commands.prepare import main; "
            "sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONHASHSEED=str(hash_seed))
    subprocess.run([sys.executable, "-c", code, corpus, "--out", out, "--model-type", model_type, "--vocab-size", "300",
                    "--max-seq-length", "32", "--dupe-factor", "2", "--no-progress"], check=True, env=env,
                   capture_output=True)
    files = {}
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, out)
            if rel == "index.json":
                index = json.load(open(path))
                index["summary"].pop("seconds")
                files[rel] = index
            else:
                files[rel] = open(path, "rb").read()
    return files


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["bert", "xlm-roberta"])
def test_prepare_gives_the_same_data_on_every_run(tmp_path, model_type):
    """Two processes with different hash seeds: the same vocabulary, the same shards, byte for byte."""
    from fastbert.data.corpus import write_documents

    corpus = str(tmp_path / "ko.txt")
    write_documents(DOCUMENTS * 3, corpus)
    first = _prepare_in_a_process(corpus, str(tmp_path / "a"), model_type, 1)
    second = _prepare_in_a_process(corpus, str(tmp_path / "b"), model_type, 2)
    assert sorted(first) == sorted(second) and "tokenizer.json" in first and any(k.endswith(".ids.npy") for k in first)
    for name in first:
        assert first[name] == second[name], name
