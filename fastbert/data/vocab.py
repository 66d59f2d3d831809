"""Tokenizers for pretraining, with the `tokenizers` library: train a new vocabulary on a corpus, or
load one (a BERT vocab.txt, a tokenizer.json, or a directory holding either). Two kinds
(tokenizer_kind):

  * "wordpiece" (BERT, train_wordpiece): BertNormalizer (clean text, CJK characters split,
    lower-casing unless cased), BertPreTokenizer (whitespace and punctuation), WordPiece with "##"
    continuation pieces; [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0..4.
  * "unigram" (XLM-RoBERTa, train_unigram): sentencepiece-style pieces, cased; NFKC with runs of
    spaces collapsed, words split at whitespace and marked with "▁" (Metaspace), as XLM-R's
    tokenizer.json; <s> <pad> </s> <unk> as ids 0..3, then the pieces, then <mask>; "<s> A </s>" and
    "<s> A </s></s> B </s>".

special_token_ids and check_special_tokens name the special tokens of both kinds by BERT's roles
("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"; for Unigram <pad>, <unk>, <s>, </s>, <mask>), so the
rest of the code reads one set of keys.

Accents (strip_accents, WordPiece): BERT's uncased models strip them by decomposing the text (NFD)
and dropping the combining marks, and keep the text decomposed, which turns every Hangul syllable
into loose conjoining jamo (a vocabulary no Korean reader can read, and decode(encode(s)) != s).
The default here, strip_accents=None with lower-casing, drops the combining marks and then
recomposes (NFD, StripAccents, NFC): "café" -> "cafe" as in BERT, "한국어" stays "한국어".
strip_accents=True is BERT's own form (text left decomposed), False keeps every accent; cased
tokenizers keep accents unless strip_accents=True. On English text all three lower-casing forms
give the same ids.

The saved WordPiece directory (tokenizer.json, vocab.txt, tokenizer_config.json,
special_tokens_map.json) loads with transformers' AutoTokenizer / BertTokenizerFast, which run the
normaliser of tokenizer.json. The slow BertTokenizer has no recomposition step: from vocab.txt
alone it matches only strip_accents=True and False (tokenizer_config.json says which was used).
The saved Unigram directory (tokenizer.json, tokenizer_config.json, special_tokens_map.json; no
vocab.txt) loads with AutoTokenizer as tokenizer.json is, giving the same ids on any text.
tokenizer_config.json names PreTrainedTokenizerFast rather than XLMRobertaTokenizer: transformers 5
rebuilds an XLMRobertaTokenizer from the pieces alone and keeps a normaliser only when it is
sentencepiece's precompiled one, so it would skip the NFKC step (full-width forms, ligatures and
compatibility jamo such as "ㅋ" would get other ids there).

Training is deterministic: the trainers are fastbert's own (vocab_trainers.py) and break every tie by a
fixed order (count descending, then the token string), never by hash-map order, so the same corpus
and settings give the same vocabulary in every process. (The `tokenizers` library's trainers break
ties in hash-map order, which changes from process to process.) A prepared data directory keeps its
vocabulary (and `fastbert pretrain` reuses a prepared directory); pass a vocabulary (--vocab) to use
one made elsewhere.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, Iterator, List, Optional, Union

from fastbert.data import vocab_trainers
from fastbert.data.vocab_trainers import EmptyCorpusError  # noqa: F401  (raised by the trainers for a corpus with no words)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
REQUIRED_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
# XLM-R's special tokens: ids 0..3, and <mask> after the pieces
UNIGRAM_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")
UNIGRAM_MASK = "<mask>"
UNIGRAM_ROLES = {"[PAD]": "<pad>", "[UNK]": "<unk>", "[CLS]": "<s>", "[SEP]": "</s>", "[MASK]": "<mask>"}
METASPACE = "\u2581"
KINDS = {"WordPiece": "wordpiece", "Unigram": "unigram"}


def _normalizer(lowercase: bool, strip_accents: Optional[bool]):
    from tokenizers import normalizers

    bert = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase,
                                      strip_accents=bool(strip_accents))
    if strip_accents is None and lowercase:
        return normalizers.Sequence([bert, normalizers.NFD(), normalizers.StripAccents(), normalizers.NFC()])
    return bert


def bert_pipeline(tok, lowercase: bool, strip_accents: Optional[bool] = None):
    from tokenizers import decoders, pre_tokenizers

    tok.normalizer = _normalizer(lowercase, strip_accents)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def unigram_pipeline(tok):
    """XLM-R's pipeline: NFKC with runs of spaces collapsed, whitespace words marked with "▁"."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")])
    tok.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    return tok


def _reading(texts: Iterable[str], length: Optional[int], show_progress: bool) -> Iterable[str]:
    if not show_progress:
        return texts
    from tqdm.auto import tqdm

    return tqdm(texts, total=length, desc="vocabulary: counting words", unit=" text", dynamic_ncols=True, leave=False)


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
    [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0..4 (strip_accents: see the module docstring). The same
    texts and settings give the same vocabulary on every run. length: the number of texts, for the
    progress bar that show_progress draws while the words are counted."""
    from tokenizers import Tokenizer, models

    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"fastbert: vocab_size {vocab_size} is too small (at least {len(SPECIAL_TOKENS) + 1})")
    probe = bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##")), lowercase,
                           strip_accents)
    counts = vocab_trainers.count_words(_reading(texts, length, show_progress), probe)
    tokens = vocab_trainers.wordpiece_vocab(counts, vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=min_frequency,
                                      limit_alphabet=limit_alphabet, prefix="##")
    model = models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]", continuing_subword_prefix="##")
    tok = bert_pipeline(Tokenizer(model), lowercase, strip_accents)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def train_unigram(texts: Iterable[str], vocab_size: int, *, length: Optional[int] = None, show_progress: bool = False):
    """A new XLM-RoBERTa-style (sentencepiece Unigram) tokenizer trained on `texts` (any iterable of
    strings, streamed): cased, <s> <pad> </s> <unk> as ids 0..3, the pieces, <mask> as the last id
    (see the module docstring). The same texts give the same pieces and scores on every run."""
    from tokenizers import AddedToken, Tokenizer, models, processors

    specials = UNIGRAM_SPECIAL_TOKENS + (UNIGRAM_MASK,)
    if vocab_size < len(specials) + 1:
        raise ValueError(f"fastbert: vocab_size {vocab_size} is too small (at least {len(specials) + 1})")
    probe = unigram_pipeline(Tokenizer(models.Unigram()))
    counts = vocab_trainers.count_words(_reading(texts, length, show_progress), probe)
    pieces = [(p, s) for p, s in vocab_trainers.unigram_pieces(counts, vocab_size, n_special=len(specials)) if p not in specials]
    vocab = [(t, 0.0) for t in UNIGRAM_SPECIAL_TOKENS] + pieces + [(UNIGRAM_MASK, 0.0)]
    unk = UNIGRAM_SPECIAL_TOKENS.index("<unk>")
    tok = unigram_pipeline(Tokenizer(models.Unigram(vocab, unk_id=unk, byte_fallback=False)))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in UNIGRAM_SPECIAL_TOKENS]
                           + [AddedToken(UNIGRAM_MASK, lstrip=True, special=True, normalized=False)])
    cls, sep = UNIGRAM_ROLES["[CLS]"], UNIGRAM_ROLES["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])
    return tok


def tokenizer_kind(tok) -> str:
    """The kind of the tokenizer's model: "wordpiece" or "unigram" (ValueError for any other)."""
    name = type(tok.model).__name__
    if name not in KINDS:
        raise ValueError(f"fastbert: a {name} tokenizer is neither WordPiece nor Unigram, the two kinds fastbert reads")
    return KINDS[name]


def _role_names(tok) -> Dict[str, str]:
    """{BERT role: the token that plays it in `tok`}."""
    return dict(UNIGRAM_ROLES) if tokenizer_kind(tok) == "unigram" else {t: t for t in SPECIAL_TOKENS}


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
        tok = bert_pipeline(Tokenizer(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##")), lowercase,
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
    """{BERT role: id} of the special tokens the vocabulary has, keyed "[PAD]" "[UNK]" "[CLS]"
    "[SEP]" "[MASK]" for both kinds (a Unigram tokenizer's <pad> <unk> <s> </s> <mask>)."""
    ids = {role: tok.token_to_id(name) for role, name in _role_names(tok).items()}
    return {role: i for role, i in ids.items() if i is not None}


def check_special_tokens(tok, source: str = "the vocabulary") -> Dict[str, int]:
    """{BERT role: id} of the special tokens (see special_token_ids); ValueError naming those of the
    [PAD] [CLS] [SEP] [MASK] roles that are missing (pretraining needs all four)."""
    ids = special_token_ids(tok)
    names = _role_names(tok)
    missing = [names[r] for r in REQUIRED_TOKENS if r not in ids]
    if missing:
        what = "an XLM-R (Unigram)" if tokenizer_kind(tok) == "unigram" else "a BERT"
        raise ValueError(
            f"fastbert: {source} lacks the special token(s) {', '.join(missing)}; {what} pretraining vocabulary "
            f"needs {', '.join(names[r] for r in REQUIRED_TOKENS)} (and {names['[UNK]']})"
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
    if type(tok.model).__name__ == "Unigram":
        return False  # cased, as XLM-R
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
    """WordPiece: tokenizer.json + vocab.txt + tokenizer_config.json + special_tokens_map.json.
    Unigram: tokenizer.json + tokenizer_config.json + special_tokens_map.json as transformers writes
    XLM-R's (a vocab.txt left there by an earlier WordPiece vocabulary is removed)."""
    os.makedirs(directory, exist_ok=True)
    _atomic_text(os.path.join(directory, "tokenizer.json"), tok.to_str(pretty=True))
    if tokenizer_kind(tok) == "unigram":
        _save_unigram_config(tok, directory, model_max_length)
        return
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


def _save_unigram_config(tok, directory: str, model_max_length: int) -> None:
    def added(t) -> dict:
        return {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                "single_word": t.single_word, "special": t.special}

    decoder = tok.get_added_tokens_decoder()
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>", "pad_token": "<pad>",
               "cls_token": "<s>", "mask_token": UNIGRAM_MASK}
    config = {
        # tokenizer.json as it is: transformers 5 rebuilds an XLMRobertaTokenizer from the pieces alone and
        # keeps no normaliser but sentencepiece's precompiled one, so NFKC text (full-width digits,
        # compatibility jamo such as "ㅋ") would get other ids there
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(model_max_length),
        **special,
        "add_prefix_space": True,
        "clean_up_tokenization_spaces": False,  # decode gives the text back, as tokenizers' decoder does
        "added_tokens_decoder": {str(i): added(decoder[i]) for i in sorted(decoder)},
    }
    _atomic_text(os.path.join(directory, "tokenizer_config.json"), json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    mask = next((t for t in decoder.values() if t.content == UNIGRAM_MASK), None)
    if mask is not None:
        special["mask_token"] = added(mask)
    _atomic_text(os.path.join(directory, "special_tokens_map.json"), json.dumps(special, indent=2) + "\n")
    stale = os.path.join(directory, "vocab.txt")
    if os.path.isfile(stale):
        os.remove(stale)


def word_start_table(tok):
    """torch.bool [vocab size]: True where a token starts a word (for whole-word masking). WordPiece:
    the tokens without the continuation prefix ("##"); Unigram: the pieces that begin with "▁"
    and the special tokens."""
    import torch

    tokens = vocab_list(tok)
    if tokenizer_kind(tok) == "unigram":
        special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        starts = [t.startswith(METASPACE) or t in special for t in tokens]
    else:
        prefix = getattr(tok.model, "continuing_subword_prefix", None) or "##"
        starts = [not t.startswith(prefix) for t in tokens]
    return torch.tensor(starts, dtype=torch.bool)


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
