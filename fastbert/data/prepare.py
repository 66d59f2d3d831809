"""`fastbert prepare`: text files -> vocabulary -> sentence pairs -> memory-mapped shards.

    fastbert prepare CORPUS [CORPUS ...] --out DIR [--vocab vocab.txt|tokenizer.json | --vocab-size N]
                     [--max-seq-length 128] [--dupe-factor 5] [--short-seq-prob 0.1] [--eval-fraction 0.05]
                     [--model-type bert|xlm-roberta]

--model-type says what the data is for (MODEL_TYPES): BERT's MLM + NSP (a WordPiece vocabulary,
sentence pairs) or XLM-RoBERTa's MLM alone (a sentencepiece Unigram vocabulary with XLM-R's special
tokens, single segments of consecutive sentences). The same corpus and settings give the same
directory on every run: the vocabulary trainers break every tie by a fixed order (vocab.py).

The corpus is read twice when a vocabulary is trained (once to train it, once to tokenize), never
held in memory whole. See corpus.py for the text layouts, instances.py for the pair recipe and
pretraining_shards.py for what is written.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings
from typing import Callable, Iterable, List, Optional, Sequence

from fastbert.data import corpus as corpus_mod
from fastbert.data import pretraining_shards
from fastbert.data import vocab as vocab_mod
from fastbert.data.instances import PairMaker, TokenizedCorpus, split_documents

# model_type -> (vocabulary, whether the data has sentence pairs for next-sentence prediction)
MODEL_TYPES = {"bert": ("wordpiece", True), "xlm-roberta": ("unigram", False)}


class PrepareError(ValueError):
    """Bad input to data preparation (reported as a one-line error by the command)."""


def _progress(enabled: bool, **kw):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kw, dynamic_ncols=True, leave=False)


def prepare_data(
    out_dir: str,
    *,
    corpus: Optional[Sequence[str]] = None,
    documents: Optional[Callable[[], Iterable[List[str]]]] = None,
    corpus_format: str = "auto",
    vocab: Optional[str] = None,
    vocab_size: int = 30522,
    lowercase: bool = True,
    strip_accents: Optional[bool] = None,
    min_frequency: int = 2,
    max_seq_length: int = 128,
    dupe_factor: int = 5,
    short_seq_prob: float = 0.1,
    eval_fraction: float = 0.05,
    shard_size: int = 100_000,
    seed: int = 12345,
    progress: bool = True,
    keep_tokenized: bool = False,
    model_type: str = "bert",
    log: Callable[[str], None] = print,
) -> dict:
    """Prepare a pretraining data directory; returns its index (see pretraining_shards.py).

    The text comes from the files / directories `corpus`, or from `documents`, a function returning a
    fresh iterable of documents (lists of sentences) each time it is called. strip_accents: None
    strips accents and recomposes (Hangul stays whole), True BERT's decomposed form, False keeps
    them (fastbert.data.vocab); it applies to a trained WordPiece vocabulary. model_type: see
    MODEL_TYPES."""
    if (corpus is None) == (documents is None):
        raise ValueError("fastbert prepare: give exactly one of corpus (paths) or documents")
    if model_type not in MODEL_TYPES:
        raise PrepareError(f"fastbert prepare: model_type must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}")
    kind, next_sentence = MODEL_TYPES[model_type]
    _check_settings(dupe_factor, short_seq_prob, eval_fraction, max_seq_length)
    t0 = time.perf_counter()
    documents_fn = _document_source(corpus, documents, corpus_format)
    os.makedirs(out_dir, exist_ok=True)
    stale = os.path.join(out_dir, pretraining_shards.INDEX)
    if os.path.exists(stale):
        os.remove(stale)  # the directory is not valid data until the new index is written

    tok = _vocabulary(vocab, kind, documents_fn, corpus, vocab_size, lowercase, strip_accents, min_frequency, progress,
                      log)
    special = vocab_mod.check_special_tokens(tok)
    vocab_mod.save_tokenizer(tok, out_dir, model_max_length=max_seq_length)
    stats = corpus_mod.CorpusStats()
    tok_dir = os.path.join(out_dir, "tokenized")
    tc = _tokenize(documents_fn, stats, tok, tok_dir, corpus, progress, next_sentence)

    train_docs, eval_docs = split_documents(tc.num_documents, eval_fraction, seed)
    if eval_fraction > 0 and len(eval_docs) == 0:
        log(f"note: {tc.num_documents} documents are too few for a held-out split; there is none")
    splits, pair_stats = {}, {}
    for split, docs, s in (("train", train_docs, seed), ("eval", eval_docs, seed + 1)):
        if len(docs):
            splits[split], pair_stats[split] = _write_pairs(
                out_dir, split, tc, docs, tok.get_vocab_size(), special, max_seq_length=max_seq_length,
                short_seq_prob=short_seq_prob, dupe_factor=dupe_factor, shard_size=shard_size, seed=s,
                progress=progress, next_sentence=next_sentence)
    if not keep_tokenized:
        shutil.rmtree(tok_dir, ignore_errors=True)

    settings = {
        "dupe_factor": dupe_factor, "short_seq_prob": short_seq_prob, "eval_fraction": eval_fraction,
        "seed": seed, "corpus_format": corpus_format, "vocab": vocab, "shard_size": shard_size,
        "corpus": [os.fspath(p) for p in corpus] if corpus is not None else "built-in",
    }
    index = _index(tok, special, max_seq_length, splits, settings, _summary(stats, tc, splits, pair_stats, t0))
    index.update(model_type=model_type, next_sentence=next_sentence)
    pretraining_shards.write_index(out_dir, index)
    return index


def _summary(stats, tc: TokenizedCorpus, splits: dict, pair_stats: dict, t0: float) -> dict:
    """What the corpus held and what was made of it (printed by `fastbert prepare`, kept in the index)."""
    return {
        "corpus": stats.as_dict(),
        "documents": tc.num_documents,
        "sentences": int(tc.meta["sentences"]),
        "corpus_tokens": int(tc.meta["tokens"]),
        "skipped_empty_sentences": int(tc.meta["empty_sentences"]),
        "pairs": {k: v["instances"] for k, v in splits.items()},
        "pair_tokens": {k: v["tokens"] for k, v in splits.items()},
        "is_next_share": {k: (v["is_next"] / v["instances"] if v["instances"] else 0.0) for k, v in splits.items()},
        "pair_stats": pair_stats,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _index(tok, special: dict, max_seq_length: int, splits: dict, settings: dict, summary: dict) -> dict:
    """The data directory's index (see pretraining_shards.py): what the trainer reads to use the shards."""
    return {
        "max_seq_length": int(max_seq_length),
        "vocab_size": int(tok.get_vocab_size()),
        "special_tokens": special,
        "lowercase": vocab_mod.is_lowercase(tok),
        "tokenizer": "tokenizer.json",
        "token_dtype": str(pretraining_shards.token_dtype(tok.get_vocab_size())().dtype),
        "splits": splits,
        "settings": settings,
        "summary": summary,
    }


def _check_settings(dupe_factor: int, short_seq_prob: float, eval_fraction: float, max_seq_length: int) -> None:
    if dupe_factor < 1:
        raise PrepareError(f"fastbert prepare: dupe_factor must be >= 1, got {dupe_factor}")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise PrepareError(f"fastbert prepare: short_seq_prob must be in [0, 1], got {short_seq_prob}")
    if not 0.0 <= eval_fraction < 1.0:
        raise PrepareError(f"fastbert prepare: eval_fraction must be in [0, 1), got {eval_fraction}")
    if max_seq_length < 8:
        raise PrepareError(f"fastbert prepare: max_seq_length must be >= 8, got {max_seq_length}")


def _document_source(corpus, documents, corpus_format: str) -> Callable:
    """documents_fn(stats=None): a fresh iterable of documents on every call, counting into stats."""
    if corpus is not None:
        try:
            files = corpus_mod.expand_paths(corpus)
        except FileNotFoundError as e:
            raise PrepareError(str(e)) from None
        if not files:
            raise PrepareError(f"fastbert prepare: no files found in {', '.join(map(str, corpus))}")

        def documents_fn(stats=None):
            return corpus_mod.read_documents(files, corpus_format, stats)
    else:
        def documents_fn(stats=None):
            for doc in documents():
                if stats is not None:
                    stats.documents += 1
                    stats.sentences += len(doc)
                yield doc
    return documents_fn


def _vocabulary(vocab, kind, documents_fn, corpus, vocab_size, lowercase, strip_accents, min_frequency, progress, log):
    """The tokenizer: loaded from `vocab`, or a vocabulary of `kind` (wordpiece, unigram) trained on
    the corpus."""
    if vocab is not None:
        try:
            tok = vocab_mod.load_tokenizer(vocab, lowercase=None if lowercase else False)
        except (FileNotFoundError, ValueError) as e:
            raise PrepareError(str(e)) from None
        if vocab_mod.tokenizer_kind(tok) != kind:
            raise PrepareError(f"fastbert prepare: {vocab} is a {vocab_mod.tokenizer_kind(tok)} vocabulary; this "
                               f"model type needs a {kind} one")
        log(f"vocabulary: {vocab} ({tok.get_vocab_size()} tokens)")
        return tok
    bar = _progress(progress, desc="vocabulary: reading", unit=" doc")
    stats0 = corpus_mod.CorpusStats()

    def sentences():
        for doc in documents_fn(stats0):
            if bar is not None:
                bar.update(1)
            yield from doc

    tv = time.perf_counter()
    try:
        if kind == "unigram":
            tok = vocab_mod.train_unigram(sentences(), vocab_size)
        else:
            tok = vocab_mod.train_wordpiece(sentences(), vocab_size, lowercase=lowercase, strip_accents=strip_accents,
                                            min_frequency=min_frequency)
    except ValueError:
        _check_text(stats0, corpus)  # no text at all: say what the corpus held
        raise
    finally:
        if bar is not None:
            bar.close()
    _check_text(stats0, corpus)
    what = "sentencepiece Unigram pieces" if kind == "unigram" else "WordPiece tokens"
    log(f"vocabulary: trained {tok.get_vocab_size()} {what} (asked for {vocab_size}) in "
        f"{time.perf_counter() - tv:.1f} s")
    return tok


def _tokenize(documents_fn, stats, tok, tok_dir: str, corpus, progress: bool, next_sentence: bool) -> TokenizedCorpus:
    """The corpus tokenized into a disk-backed store; at least 2 documents for NSP."""
    bar = _progress(progress, desc="tokenizing", unit=" sent")
    tc = TokenizedCorpus.build(documents_fn(stats), tok, tok_dir, progress=bar)
    if bar is not None:
        bar.close()
    _check_text(stats, corpus)
    for path in stats.binary_files:
        warnings.warn(f"fastbert prepare: skipped {path}: binary file (NUL bytes), not text", stacklevel=3)
    if tc.num_documents == 0:
        raise PrepareError("fastbert prepare: the corpus gave no tokens at all (every sentence was empty once tokenized)")
    if next_sentence and tc.num_documents < 2:
        raise PrepareError(
            "fastbert prepare: the corpus has 1 document; next-sentence prediction needs at least 2 (NotNext "
            "pairs take their second segment from a different document). Separate documents with a blank line "
            "(format 'lines') or two blank lines (format 'paragraphs')."
        )
    return tc


def _write_pairs(out_dir, split, tc, docs, vocab_size, special, *, max_seq_length, short_seq_prob, dupe_factor,
                 shard_size, seed, progress, next_sentence):
    """Sentence pairs (or single segments) of one split into its shards -> (the split's index entry,
    pair statistics)."""
    maker = PairMaker(tc, docs, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, seed=seed,
                      next_sentence=next_sentence)
    writer = pretraining_shards.ShardWriter(out_dir, split, vocab_size=vocab_size, shard_size=shard_size, seed=seed)
    bar = _progress(progress, desc=f"{'pairs' if next_sentence else 'sequences'} ({split})", unit=" seq")
    for inst in maker.instances(dupe_factor):
        writer.add(inst.input_ids(special["[CLS]"], special["[SEP]"]), inst.segment_a_length, int(inst.is_random_next))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    entry = writer.close()
    entry["documents"] = int(len(docs))
    return entry, maker.stats.as_dict()


def _check_text(stats: corpus_mod.CorpusStats, corpus) -> None:
    if stats.sentences:
        return
    where = ", ".join(map(str, corpus)) if corpus is not None else "the documents given"
    parts = [f"{stats.files} file(s)", f"{stats.lines} line(s)"]
    if stats.binary_files:
        parts.append(f"binary, skipped: {', '.join(stats.binary_files)}")
    if stats.empty_files:
        parts.append(f"{len(stats.empty_files)} empty file(s)")
    if stats.undecodable_lines:
        parts.append(f"{stats.undecodable_lines} undecodable line(s)")
    raise PrepareError(f"fastbert prepare: the corpus has no text ({where}: {'; '.join(parts)})")


def format_summary(index: dict) -> str:
    s = index["summary"]
    c = s["corpus"]
    source = index["settings"].get("corpus")
    rows = [
        ("source", "the built-in corpus (pydoc_data.topics)") if source == "built-in" else ("files", c["files"]),
        ("documents", s["documents"]),
        ("sentences", s["sentences"]),
        ("tokens (corpus)", s["corpus_tokens"]),
    ]
    pairs = index.get("next_sentence", True)
    for split, n in s["pairs"].items():
        share = f"IsNext {s['is_next_share'][split]:.3f}, " if pairs else ""
        rows.append((f"{'pairs' if pairs else 'sequences'} ({split})", f"{n}  ({share}{s['pair_tokens'][split]} tokens, "
                                                                          f"{index['splits'][split]['documents']} documents)"))
    rows += [
        ("skipped: undecodable lines", c["skipped_undecodable_lines"]),
        ("skipped: empty lines", c["skipped_empty_lines"]),
        ("skipped: empty sentences", s["skipped_empty_sentences"]),
        ("skipped: binary files", len(c["skipped_binary_files"])),
        ("vocabulary", f"{index['vocab_size']} tokens ({'uncased' if index['lowercase'] else 'cased'}, "
                       f"{'Unigram' if index.get('model_type') == 'xlm-roberta' else 'WordPiece'})"),
        ("max_seq_length", index["max_seq_length"]),
        ("time", f"{s['seconds']:.1f} s"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{w}}  {v}" for k, v in rows)


def add_data_arguments(p: argparse.ArgumentParser, *, defaults: Optional[dict] = None,
                       default_text: Optional[dict] = None) -> None:
    """The data options. `defaults` overrides the parser defaults (None: filled in later by the
    caller), `default_text` what the help says about them."""
    d = {"vocab_size": 30522, "max_seq_length": 128, "dupe_factor": 5, "eval_fraction": 0.05}
    d.update(defaults or {})
    text = {k: f"default {v}" for k, v in d.items()}
    text.update(default_text or {})
    g = p.add_argument_group("data preparation")
    g.add_argument("--model-type", choices=sorted(MODEL_TYPES), default="bert",
                   help="bert (default): a WordPiece vocabulary and sentence pairs for MLM + NSP; xlm-roberta: a "
                        "sentencepiece Unigram vocabulary (cased, XLM-R's special tokens) and single segments for MLM")
    g.add_argument("--format", dest="corpus_format", choices=corpus_mod.FORMATS, default="auto",
                   help="corpus layout: 'lines' = one sentence per line, blank line between documents; "
                        "'paragraphs' = running text split into sentences, two blank lines between documents; "
                        "'auto' (default) decides per file")
    g.add_argument("--vocab", help="use this vocabulary (vocab.txt, tokenizer.json or a directory) instead of training one")
    g.add_argument("--vocab-size", type=int, default=d["vocab_size"],
                   help=f"size of the trained vocabulary ({text['vocab_size']})")
    g.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    g.add_argument("--strip-accents", action=argparse.BooleanOptionalAction, default=None,
                   help="--strip-accents: BERT's accent stripping, which leaves text decomposed (Hangul into "
                        "jamo); --no-strip-accents: keep accents; default: strip accents and recompose, so "
                        "Hangul and other composed scripts stay whole")
    g.add_argument("--min-frequency", type=int, default=2, help="minimum count of a trained token (default %(default)s)")
    g.add_argument("--max-seq-length", type=int, default=d["max_seq_length"],
                   help=f"tokens per pair ({text['max_seq_length']})")
    g.add_argument("--dupe-factor", type=int, default=d["dupe_factor"],
                   help=f"passes over the corpus, each with fresh pairs ({text['dupe_factor']})")
    g.add_argument("--short-seq-prob", type=float, default=0.1, help="share of shorter pairs (default %(default)s)")
    g.add_argument("--eval-fraction", type=float, default=d["eval_fraction"],
                   help=f"share of documents held out for evaluation ({text['eval_fraction']})")
    g.add_argument("--shard-size", type=int, default=100_000, help="pairs per shard (default %(default)s)")
    g.add_argument("--data-seed", type=int, default=12345, help="seed of pair creation (default %(default)s)")


def prepare_from_args(args, out_dir: str, *, corpus=None, documents=None, progress: bool = True, log=print) -> dict:
    return prepare_data(
        out_dir, corpus=corpus, documents=documents, corpus_format=args.corpus_format, vocab=args.vocab,
        vocab_size=args.vocab_size, lowercase=not args.cased, strip_accents=args.strip_accents,
        min_frequency=args.min_frequency,
        max_seq_length=args.max_seq_length, dupe_factor=args.dupe_factor, short_seq_prob=args.short_seq_prob,
        eval_fraction=args.eval_fraction, shard_size=args.shard_size, seed=args.data_seed, progress=progress, log=log,
        model_type=args.model_type,
    )

