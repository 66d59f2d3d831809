"""WordPiece tokenizers for pretraining, with the `tokenizers` library: train a new vocabulary on a
corpus, or load one (a BERT vocab.txt, a tokenizer.json, or a directory holding either).

The tokenizer is BERT's: BertNormalizer (clean text, CJK characters split, lower-casing and accent
stripping unless cased), BertPreTokenizer (whitespace and punctuation), WordPiece with "##"
continuation pieces. The saved directory (tokenizer.json, vocab.txt, tokenizer_config.json,
special_tokens_map.json) loads with transformers' AutoTokenizer / BertTokenizerFast.

The `tokenizers` trainer breaks ties between equally frequent merges in hash-map order, which
changes from process to process: two trainings on the same text can end a few tokens apart. A
prepared data directory keeps its vocabulary (and `fastbert pretrain` reuses a prepared directory),
so a run and its resumption always share one; pass a vocabulary (--vocab) to pin it across
preparations.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, Iterator, List, Optional

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
REQUIRED_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


def _bert_pipeline(tok, lowercase: bool):
    from tokenizers import decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    length: Optional[int] = None,
    show_progress: bool = False,
):
    """A new WordPiece tokenizer trained on `texts` (any iterable of strings, streamed) with
    [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0..4."""
    from tokenizers import Tokenizer, models, trainers

    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"fastbert: vocab_size {vocab_size} is too small (at least {len(SPECIAL_TOKENS) + 1})")
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##")), lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return tok


def load_tokenizer(path: str, *, lowercase: Optional[bool] = None):
    """A tokenizer from a vocab.txt (one WordPiece token per line), a tokenizer.json, or a directory
    holding one of them (tokenizer.json preferred). `lowercase` applies to vocab.txt only (default
    True, or what a tokenizer_config.json next to it says)."""
    from tokenizers import Tokenizer, models

    if os.path.isdir(path):
        for name in ("tokenizer.json", "vocab.txt"):
            if os.path.isfile(os.path.join(path, name)):
                return load_tokenizer(os.path.join(path, name), lowercase=lowercase)
        raise FileNotFoundError(f"fastbert: {path} holds neither tokenizer.json nor vocab.txt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"fastbert: vocabulary file {path} does not exist")
    if path.endswith(".json"):
        try:
            tok = Tokenizer.from_file(path)
        except Exception as e:
            raise ValueError(f"fastbert: {path} is not a tokenizers tokenizer.json ({e})") from None
    else:
        with open(path, "rb") as f:
            head = f.read(4096)
        if b"\x00" in head:
            raise ValueError(f"fastbert: vocabulary file {path} is binary; expected one token per line (vocab.txt)")
        vocab: Dict[str, int] = {}
        with open(path, encoding="utf-8", errors="strict") as f:
            for line in f:
                token = line.rstrip("\r\n")
                if token and token not in vocab:
                    vocab[token] = len(vocab)
        if not vocab:
            raise ValueError(f"fastbert: vocabulary file {path} is empty")
        if lowercase is None:
            lowercase = _config_lowercase(os.path.dirname(path))
        unk = "[UNK]" if "[UNK]" in vocab else None
        if unk is None:
            raise ValueError(f"fastbert: vocabulary {path} has no [UNK] token")
        tok = _bert_pipeline(Tokenizer(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##")), lowercase)
    check_special_tokens(tok, source=path)
    return tok


def _config_lowercase(directory: str) -> bool:
    cfg = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(cfg):
        try:
            with open(cfg, encoding="utf-8") as f:
                return bool(json.load(f).get("do_lower_case", True))
        except (OSError, ValueError):
            pass
    return True


def special_token_ids(tok) -> Dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS if tok.token_to_id(t) is not None}


def check_special_tokens(tok, source: str = "the vocabulary") -> Dict[str, int]:
    """{token: id} of the special tokens; ValueError naming those of [PAD] [CLS] [SEP] [MASK] that
    are missing (pretraining needs all four)."""
    ids = special_token_ids(tok)
    missing = [t for t in REQUIRED_TOKENS if t not in ids]
    if missing:
        raise ValueError(
            f"fastbert: {source} lacks the special token(s) {', '.join(missing)}; a BERT pretraining vocabulary "
            f"needs {', '.join(REQUIRED_TOKENS)} (and [UNK])"
        )
    return ids


def vocab_list(tok) -> List[str]:
    """Tokens by id (gaps, if any, as [unused<i>])."""
    v = tok.get_vocab(with_added_tokens=True)
    out = [f"[unused{i}]" for i in range(max(v.values()) + 1)]
    for t, i in v.items():
        out[i] = t
    return out


def is_lowercase(tok) -> bool:
    try:
        state = json.loads(tok.to_str())["normalizer"] or {}
    except Exception:
        return True
    return bool(state.get("lowercase", False))


def save_tokenizer(tok, directory: str, *, model_max_length: int = 512) -> None:
    """tokenizer.json + vocab.txt + tokenizer_config.json + special_tokens_map.json."""
    os.makedirs(directory, exist_ok=True)
    _atomic_text(os.path.join(directory, "tokenizer.json"), tok.to_str(pretty=True))
    _atomic_text(os.path.join(directory, "vocab.txt"), "".join(t + "\n" for t in vocab_list(tok)))
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": is_lowercase(tok),
        "model_max_length": int(model_max_length),
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "tokenize_chinese_chars": True,
        "strip_accents": None,
    }
    _atomic_text(os.path.join(directory, "tokenizer_config.json"), json.dumps(config, indent=2) + "\n")
    special = {k: config[k] for k in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")}
    _atomic_text(os.path.join(directory, "special_tokens_map.json"), json.dumps(special, indent=2) + "\n")


def _atomic_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def batched(texts: Iterable[str], n: int) -> Iterator[List[str]]:
    chunk: List[str] = []
    for t in texts:
        chunk.append(t)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
