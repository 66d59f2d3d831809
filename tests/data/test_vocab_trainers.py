"""fastbert's own vocabulary trainers (fastbert.data.vocab_trainers) and the tokenizers built from them
(fastbert.data.vocab): the same vocabulary in every process, WordPiece as BERT's trainer makes it,
Unigram with XLM-R's special tokens and pipeline, loadable by transformers."""
import json
import os
import subprocess
import sys
import unicodedata

import pytest
import torch

from fastbert.data import vocab as vocab_mod
from fastbert.data import vocab_trainers
from tests.helpers.korean_text import DOCUMENTS

KOREAN = [s for doc in DOCUMENTS for s in doc]
ENGLISH = ["The model reads a sentence in both directions.", "Query and passage embeddings are compared.",
           "A short line of text, and another one."]
# words of equal counts everywhere: most merges and pieces tie with others
LETTERS = "abcdefgh"
TIES = [" ".join(a + b + c for b in LETTERS for c in LETTERS[:4]) for a in LETTERS]
CORPUS = KOREAN * 2 + ENGLISH * 2 + TIES * 2

TRAIN_SCRIPT = """
import hashlib, json, sys
from fastbert.data import vocab
corpus = json.load(sys.stdin)
wp = vocab.train_wordpiece(iter(corpus), 600, min_frequency=1)
ug = vocab.train_unigram(iter(corpus), 600)
print(json.dumps({"wordpiece": vocab.vocab_list(wp), "unigram": json.loads(ug.to_str())["model"]["vocab"],
                  "hash": hashlib.sha256((wp.to_str() + ug.to_str()).encode()).hexdigest()}))
"""


def _train_in_processes(*seeds: str) -> list:
    """The script's output from one python process per hash seed (run side by side)."""
    procs = [subprocess.Popen([sys.executable, "-c", TRAIN_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONHASHSEED=seed))
             for seed in seeds]
    outs = [p.communicate(json.dumps(CORPUS), timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    return [json.loads(out) for out, _ in outs]


@pytest.mark.slow
def test_trainers_give_the_same_vocabulary_in_every_process():
    runs = _train_in_processes("1", "2")
    assert runs[0]["hash"] == runs[1]["hash"]
    assert runs[0]["wordpiece"] == runs[1]["wordpiece"] and runs[0]["unigram"] == runs[1]["unigram"]
    here = vocab_mod.train_wordpiece(iter(CORPUS), 600, min_frequency=1)  # this process's own hash seed
    assert vocab_mod.vocab_list(here) == runs[0]["wordpiece"]
    assert len(runs[0]["wordpiece"]) == 600 and len(runs[0]["unigram"]) == 600


def _bert_probe(lowercase=True):
    from tokenizers import Tokenizer, models

    return vocab_mod.bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)


def test_count_words_streams_and_splits_as_the_pipeline():
    texts = (s for s in ["Hello, world!", "hello  again", ""])  # a generator, read once
    assert vocab_trainers.count_words(texts, _bert_probe()) == {"hello": 2, ",": 1, "world": 1, "!": 1, "again": 1}
    from tokenizers import Tokenizer, models

    probe = vocab_mod.unigram_pipeline(Tokenizer(models.Unigram()))
    assert vocab_trainers.count_words(["Hello,  world  hello", "ｗｏｒｌｄ"], probe) == {
        "\u2581Hello,": 1, "\u2581world": 2, "\u2581hello": 1}  # cased, NFKC folds the full-width letters


def test_wordpiece_merges_in_a_fixed_order():
    specials = list(vocab_mod.SPECIAL_TOKENS)
    # every pair of "abcd" is as frequent as the others: the smaller merged string goes first
    got = vocab_trainers.wordpiece_vocab({"abcd": 5}, 100, special_tokens=specials)
    assert got == specials + ["a", "b", "c", "d", "##b", "##c", "##d", "##bc", "##bcd", "abcd"]


def test_wordpiece_min_frequency():
    specials = list(vocab_mod.SPECIAL_TOKENS)
    base = specials + ["a", "b", "c", "d", "##b", "##d"]
    assert vocab_trainers.wordpiece_vocab({"ab": 3, "cd": 1}, 100, special_tokens=specials) == base + ["ab"]
    assert vocab_trainers.wordpiece_vocab({"ab": 3, "cd": 1}, 100, special_tokens=specials, min_frequency=4) == base
    assert (vocab_trainers.wordpiece_vocab({"ab": 3, "cd": 1}, 100, special_tokens=specials, min_frequency=1)
            == base + ["ab", "cd"])


def test_wordpiece_keeps_the_most_used_characters_when_they_do_not_fit():
    specials = list(vocab_mod.SPECIAL_TOKENS)
    # used: "a" 3, "##b" 3, "c" 1, "##d" 1, "b" 0, "d" 0; room for 3
    assert vocab_trainers.wordpiece_vocab({"ab": 3, "cd": 1}, 8, special_tokens=specials) == specials + ["a", "##b", "##d"]


def test_wordpiece_alphabet_limit_splits_words():
    specials = list(vocab_mod.SPECIAL_TOKENS)
    # "z" is the rarest character: outside an alphabet of 3, it is no token and no merge spans it
    got = vocab_trainers.wordpiece_vocab({"azb": 4, "ab": 4, "b": 1}, 100, special_tokens=specials, limit_alphabet=2)
    assert got == specials + ["a", "b", "##b", "ab"]


def test_wordpiece_tokenizer():
    tok = vocab_mod.train_wordpiece(iter(CORPUS), 300, min_frequency=1, lowercase=False)
    assert [tok.id_to_token(i) for i in range(5)] == list(vocab_mod.SPECIAL_TOKENS)
    assert vocab_mod.special_token_ids(tok) == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    assert vocab_mod.tokenizer_kind(tok) == "wordpiece"
    assert tok.get_vocab_size() == 300  # the corpus has more than enough merges
    big = vocab_mod.train_wordpiece(iter(CORPUS), 5000, min_frequency=1)
    assert len(vocab_mod.vocab_list(big)) == big.get_vocab_size() < 5000  # it has too few for this one
    words = vocab_trainers.count_words(CORPUS, _bert_probe(lowercase=False))
    for word in words:
        assert 1 not in tok.encode(word, add_special_tokens=False).ids, word
    assert tok.encode("鬱", add_special_tokens=False).ids == [1]  # a character never seen


def test_bad_sizes_and_empty_corpora():
    with pytest.raises(ValueError, match=r"^fastbert: vocab_size 5 is too small"):
        vocab_mod.train_wordpiece(CORPUS, 5)
    with pytest.raises(ValueError, match=r"^fastbert: vocab_size 5 is too small"):
        vocab_mod.train_unigram(CORPUS, 5)
    for train in (vocab_mod.train_wordpiece, vocab_mod.train_unigram):
        with pytest.raises(vocab_trainers.EmptyCorpusError, match=r"^fastbert: the corpus has no text"):
            train(iter(["", "   "]), 100)


def _normalised(s: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", s).split())


def test_unigram_tokenizer_has_xlmr_ids_and_reads_korean():
    tok = vocab_mod.train_unigram(iter(KOREAN * 3 + ENGLISH), 400)
    n = tok.get_vocab_size()
    assert n <= 400 and vocab_mod.tokenizer_kind(tok) == "unigram" and not vocab_mod.is_lowercase(tok)
    assert [tok.id_to_token(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"] and tok.id_to_token(n - 1) == "<mask>"
    assert vocab_mod.check_special_tokens(tok) == {"[PAD]": 1, "[UNK]": 3, "[CLS]": 0, "[SEP]": 2, "[MASK]": n - 1}
    assert vocab_mod.vocab_list(tok)[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and len(vocab_mod.vocab_list(tok)) == n
    for s in KOREAN + ENGLISH + ["  버트는   두 문장을   읽는다 "]:
        enc = tok.encode(s)
        assert enc.ids[0] == 0 and enc.ids[-1] == 2 and 3 not in enc.ids, s
        assert tok.decode(enc.ids) == _normalised(s)
    assert 3 in tok.encode("鬱").ids  # a character never seen


def test_unigram_pieces_keep_characters_and_are_sorted():
    from tokenizers import Tokenizer, models

    counts = vocab_trainers.count_words(CORPUS, vocab_mod.unigram_pipeline(Tokenizer(models.Unigram())))
    chars = {ch for w in counts for ch in w}
    pieces = vocab_trainers.unigram_pieces(counts, len(chars) + 25, n_special=5)
    names = [p for p, _ in pieces]
    assert chars <= set(names) and len(pieces) <= len(chars) + 20 and len(set(names)) == len(names)
    assert pieces == sorted(pieces, key=lambda kv: (-kv[1], kv[0])) and all(s < 0 for _, s in pieces)
    assert any(len(p) > 1 for p in names)
    few = vocab_trainers.unigram_pieces(counts, 15, n_special=5)  # fewer than the characters: the most frequent
    assert len(few) == 10 and all(len(p) == 1 for p, _ in few) and "\u2581" in dict(few)


def test_saved_unigram_tokenizer_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = vocab_mod.train_unigram(iter(KOREAN * 3 + ENGLISH * 3), 400)
    vocab_mod.save_tokenizer(tok, str(tmp_path), model_max_length=128)
    assert sorted(os.listdir(tmp_path)) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["model_max_length"] == 128
    assert (config["cls_token"], config["sep_token"], config["mask_token"]) == ("<s>", "</s>", "<mask>")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.cls_token_id, hf.pad_token_id, hf.sep_token_id, hf.unk_token_id, hf.mask_token_id) == \
           (0, 1, 2, 3, tok.get_vocab_size() - 1)
    # the same ids on any text, NFKC's changes included (full-width digits, compatibility jamo)
    for s in KOREAN[:6] + ENGLISH + ["ㅋㅋ 정말 １２３ 개", "ﬁne  spaces"]:
        assert hf(s)["input_ids"] == tok.encode(s).ids, s
    for a, b in [(KOREAN[0], KOREAN[1]), (ENGLISH[0], KOREAN[2]), (ENGLISH[1], ENGLISH[2])]:
        ids = hf(a, b)["input_ids"]
        assert ids == tok.encode(a, b).ids
        part = [tok.encode(t, add_special_tokens=False).ids for t in (a, b)]
        assert ids == [0] + part[0] + [2, 2] + part[1] + [2]
        assert hf.decode(ids) == f"<s> {a}</s></s> {b}</s>"
    again = vocab_mod.load_tokenizer(str(tmp_path))
    assert vocab_mod.vocab_list(again) == vocab_mod.vocab_list(tok) and again.encode(KOREAN[3]).ids == tok.encode(KOREAN[3]).ids


def test_word_start_table():
    wp = vocab_mod.train_wordpiece(iter(CORPUS), 300, min_frequency=1)
    table = vocab_mod.word_start_table(wp)
    tokens = vocab_mod.vocab_list(wp)
    assert table.dtype == torch.bool and table.shape == (len(tokens),)
    assert table.tolist() == [not t.startswith("##") for t in tokens] and not table.all() and table.any()
    ug = vocab_mod.train_unigram(iter(CORPUS), 300)
    table = vocab_mod.word_start_table(ug)
    pieces = vocab_mod.vocab_list(ug)
    assert table.shape == (len(pieces),)
    specials = {"<s>", "<pad>", "</s>", "<unk>", "<mask>"}
    assert table.tolist() == [p.startswith("\u2581") or p in specials for p in pieces]
    assert table[[0, 1, 2, 3, len(pieces) - 1]].all() and not table.all()
    ids = ug.encode("버트는 문장을 읽는다", add_special_tokens=False).ids
    assert sum(table[i].item() for i in ids) == 3  # three words, one start each
