"""WordPiece tokenizers for pretraining, with the `tokenizers` library: train a new vocabulary on a
corpus, or load one (a BERT vocab.txt, a tokenizer.json, or a directory holding either).

The tokenizer is BERT's: BertNormalizer (clean text, CJK characters split, lower-casing unless
cased), BertPreTokenizer (whitespace and punctuation), WordPiece with "##" continuation pieces.

Accents (strip_accents): BERT's uncased models strip them by decomposing the text (NFD) and
dropping the combining marks, and keep the text decomposed, which turns every Hangul syllable into
loose conjoining jamo (a vocabulary no Korean reader can read, and decode(encode(s)) != s). The
default here, strip_accents=None with lower-casing, drops the combining marks and then recomposes
(NFD, StripAccents, NFC): "café" -> "cafe" as in BERT, "한국어" stays "한국어". strip_accents=True is
BERT's own form (text left decomposed), False keeps every accent; cased tokenizers keep accents
unless strip_accents=True. On English text all three lower-casing forms give the same ids.

The saved directory (tokenizer.json, vocab.txt, tokenizer_config.json, special_tokens_map.json)
loads with transformers' AutoTokenizer / BertTokenizerFast, which run the normaliser of
tokenizer.json. The slow BertTokenizer has no recomposition step: from vocab.txt alone it matches
only strip_accents=True and False (tokenizer_config.json says which was used).

The `tokenizers` trainer breaks ties between equally frequent merges in hash-map order, which
changes from process to process: two trainings on the same text can end a few tokens apart. A
prepared data directory keeps its vocabulary (and `fastbert pretrain` reuses a prepared directory),
so a run and its resumption always share one; pass a vocabulary (--vocab) to pin it across
preparations.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, Iterator, List, Optional, Union

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
REQUIRED_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


def _normalizer(lowercase: bool, strip_accents: Optional[bool]):
    from tokenizers import normalizers

    bert = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase,
                                      strip_accents=bool(strip_accents))
    if strip_accents is None and lowercase:
        return normalizers.Sequence([bert, normalizers.NFD(), normalizers.StripAccents(), normalizers.NFC()])
    return bert


def _bert_pipeline(tok, lowercase: bool, strip_accents: Optional[bool] = None):
    from tokenizers import decoders, pre_tokenizers

    tok.normalizer = _normalizer(lowercase, strip_accents)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    *,
    lowercase: bool = True,
    strip_accents: Optional[bool] = None,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    length: Optional[int] = None,
    show_progress: bool = False,
):
    """A new WordPiece tokenizer trained on `texts` (any iterable of strings, streamed) with
    [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0..4 (strip_accents: see the module docstring)."""
    from tokenizers import Tokenizer, models, trainers

    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"fastbert: vocab_size {vocab_size} is too small (at least {len(SPECIAL_TOKENS) + 1})")
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##")), lowercase,
                         strip_accents)
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


def load_tokenizer(path: str, *, lowercase: Optional[bool] = None, strip_accents: Union[bool, None, str] = "file"):
    """A tokenizer from a vocab.txt (one WordPiece token per line), a tokenizer.json, or a directory
    holding one of them (tokenizer.json preferred). `lowercase` and `strip_accents` apply to
    vocab.txt only; by default they are read as transformers reads them from a tokenizer_config.json
    next to it (lower-cased, accents as do_lower_case, when there is none), or as fastbert saved them."""
    from tokenizers import Tokenizer, models

    if os.path.isdir(path):
        for name in ("tokenizer.json", "vocab.txt"):
            if os.path.isfile(os.path.join(path, name)):
                return load_tokenizer(os.path.join(path, name), lowercase=lowercase, strip_accents=strip_accents)
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
        config = _tokenizer_config(os.path.dirname(path))
        if lowercase is None:
            lowercase = bool(config.get("do_lower_case", True))
        if strip_accents == "file":
            strip_accents = _accents_from_config(config, lowercase)
        unk = "[UNK]" if "[UNK]" in vocab else None
        if unk is None:
            raise ValueError(f"fastbert: vocabulary {path} has no [UNK] token")
        tok = _bert_pipeline(Tokenizer(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##")), lowercase,
                             strip_accents)
    check_special_tokens(tok, source=path)
    return tok


def _accents_from_config(config: dict, lowercase: bool) -> Optional[bool]:
    """strip_accents as saved by save_tokenizer, else as transformers' BertTokenizer reads its flag
    (None: as do_lower_case, stripping into decomposed text)."""
    if "fastbert_strip_accents" in config:
        return config["fastbert_strip_accents"]
    flag = config.get("strip_accents")
    return lowercase if flag is None else bool(flag)


def _tokenizer_config(directory: str) -> dict:
    cfg = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(cfg):
        try:
            with open(cfg, encoding="utf-8") as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            pass
    return {}


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


def _bert_normalizer_state(tok) -> Optional[dict]:
    """(BertNormalizer's saved state, whether a Sequence recomposes after it), from tokenizer.json."""
    try:
        state = json.loads(tok.to_str())["normalizer"] or {}
    except Exception:
        return None
    parts = state.get("normalizers", []) if state.get("type") == "Sequence" else [state]
    bert = next((p for p in parts if p.get("type") == "BertNormalizer"), None)
    if bert is not None and state.get("type") == "Sequence":
        bert = dict(bert, recomposed=any(p.get("type") == "NFC" for p in parts))
    return bert


def is_lowercase(tok) -> bool:
    state = _bert_normalizer_state(tok)
    return True if state is None else bool(state.get("lowercase", False))


def accent_form(tok) -> Optional[bool]:
    """strip_accents of the tokenizer: None (strip, recompose), True (strip, NFD) or False (kept)."""
    state = _bert_normalizer_state(tok) or {}
    if state.get("recomposed"):
        return None
    strip = state.get("strip_accents")
    return bool(state.get("lowercase", False)) if strip is None else bool(strip)


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
        # the slow BertTokenizer's flag (None there: as do_lower_case, stripping into decomposed
        # text). It cannot recompose: for fastbert's default form it is False, which keeps Hangul
        # whole and differs only on accented letters. tokenizer.json holds the exact normaliser.
        "strip_accents": _slow_strip_accents(tok),
        "fastbert_strip_accents": accent_form(tok),  # null: stripped, then recomposed (NFC)
    }
    _atomic_text(os.path.join(directory, "tokenizer_config.json"), json.dumps(config, indent=2) + "\n")
    special = {k: config[k] for k in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")}
    _atomic_text(os.path.join(directory, "special_tokens_map.json"), json.dumps(special, indent=2) + "\n")


def _slow_strip_accents(tok) -> bool:
    form = accent_form(tok)
    return False if form is None else form


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
