"""Korean text through `fastbert pretrain` (prepare, a few steps, the saved model), then the saved
checkpoint encodes Korean sentences with its own tokenizer through transformers' AutoTokenizer,
mean-pooled as SentenceEncoder pools, and draws their attention; the vocabulary holds Hangul syllables."""
import os

import torch

from tests.helpers.korean_text import DOCUMENTS
from tests.helpers.pretraining import TINY_ARGS


def test_pretrain_on_korean_then_encode(tmp_path):
    import transformers

    import fastbert
    from fastbert import cli
    from fastbert.data.corpus import write_documents

    corpus = str(tmp_path / "ko.txt")
    write_documents(DOCUMENTS * 5, corpus)
    out = str(tmp_path / "run")
    args = [a if a != "300" else "400" for a in TINY_ARGS]  # a vocabulary with room for the syllables
    assert cli.main(["pretrain", "--corpus", corpus, "--out", out, "--max-steps", "3", "--min-frequency", "1", *args]) == 0
    vocab = open(os.path.join(out, "vocab.txt"), encoding="utf-8").read().split()
    assert sum(any("\uac00" <= c <= "\ud7a3" for c in t) for t in vocab) > 100
    assert not any("\u1100" <= c <= "\u11ff" for t in vocab for c in t)  # no loose jamo

    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = fastbert.BertModel.from_pretrained(out).eval()
    sentences = [DOCUMENTS[0][0], DOCUMENTS[2][1], "한국어 문장"]
    enc = tok(sentences, padding=True, return_tensors="pt")
    assert tok.unk_token_id not in enc["input_ids"][0].tolist()
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    emb = (hidden * mask).sum(1) / mask.sum(1)
    assert emb.shape == (3, 32) and torch.isfinite(emb).all()
    assert tok.decode(enc["input_ids"][0], skip_special_tokens=True).replace(" ", "") == \
        DOCUMENTS[0][0].replace(" ", "").lower()

    # its attention map, drawn with Hangul labels (no "Glyph missing" warning where a font has them)
    import warnings

    from fastbert import attention_maps, plotting

    probs = fastbert.attention_map(model, tok, sentences[0])
    n = len(tok(sentences[0])["input_ids"])
    assert probs.shape == (2, 2, n, n)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, n))
    with warnings.catch_warnings():
        if plotting.hangul_font() is not None:
            warnings.simplefilter("error")
        attention_maps.draw(probs, tok.convert_ids_to_tokens(tok(sentences[0])["input_ids"]), str(tmp_path / "ko.png"),
                  [0, 1], [0, 1])
    assert (tmp_path / "ko.png").stat().st_size > 0
