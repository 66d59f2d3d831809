"""Sentence-pair instances for MLM + NSP pretraining, after the recipe of BERT's
create_pretraining_data.py.

The corpus is first tokenized into a disk-backed store (TokenizedCorpus: flat token ids, sentence
and document offsets, all memory-mapped), so a corpus larger than memory streams through. Then,
for each document, in each of `dupe_factor` passes:

- a target length is drawn: max_seq_length - 3, or with probability short_seq_prob a random length
  in [2, max_seq_length - 3] (so the model also sees short sequences);
- consecutive sentences are gathered into a chunk until it reaches the target (or the document
  ends); A is the first 1..n-1 sentences of the chunk;
- with probability 1/2 B is the true continuation (IsNext, label 0): the rest of the chunk, or the
  sentences that follow in the document when A took the whole chunk; otherwise (NotNext, label 1) B
  is a run of sentences starting at a random sentence of a different document, never the same
  one, and the chunk's unused sentences go back to be read again;
- the pair is cut to max_seq_length - 3 tokens by dropping tokens one at a time from the longer
  side, from its front or its back at random, and written as [CLS] A [SEP] B [SEP] with segment
  ids 0 for [CLS] A [SEP] and 1 for B [SEP].

The original recipe gives NotNext more than half of the pairs: it forces NotNext where no
continuation exists (a chunk of one sentence at the end of a document), and a NotNext pair gives its
chunk's unused sentences back, so they make more pairs. Here, while NotNext pairs outnumber IsNext
ones so far, a NotNext draw that could have been IsNext becomes IsNext with probability 1/2: the share
of IsNext stays at 1/2 whatever the documents' sizes.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Sequence, Tuple

import numpy as np

IS_NEXT = 0
NOT_NEXT = 1


# --------------------------------------------------------------------------------------------
# the tokenized corpus: flat ids, sentence offsets, document offsets (memory-mapped)


class TokenizedCorpus:
    """Documents of tokenized sentences on disk.

    tokens.bin     int32 [n_tokens]      the token ids of every sentence, back to back
    sentences.bin  int64 [n_sent + 1]    sentence s is tokens[sentences[s]:sentences[s + 1]]
    documents.bin  int64 [n_docs + 1]    document d is sentences documents[d]..documents[d + 1] - 1
    corpus.json    the counts
    """

    def __init__(self, directory: str):
        self.directory = directory
        with open(os.path.join(directory, "corpus.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.meta = meta
        self.tokens = _memmap(os.path.join(directory, "tokens.bin"), np.int32, meta["tokens"])
        self.sentence_offsets = _memmap(os.path.join(directory, "sentences.bin"), np.int64, meta["sentences"] + 1)
        self.document_offsets = _memmap(os.path.join(directory, "documents.bin"), np.int64, meta["documents"] + 1)

    @property
    def num_documents(self) -> int:
        return int(self.meta["documents"])

    def document(self, d: int) -> List[np.ndarray]:
        """The sentences of document d, each an int32 array (views into the memory map)."""
        s0, s1 = int(self.document_offsets[d]), int(self.document_offsets[d + 1])
        offs = np.asarray(self.sentence_offsets[s0:s1 + 1])
        toks = self.tokens
        return [toks[offs[i]:offs[i + 1]] for i in range(s1 - s0)]

    @classmethod
    def build(
        cls,
        documents: Iterable[Sequence[str]],
        tokenizer,
        directory: str,
        *,
        batch_sentences: int = 4096,
        progress=None,
    ) -> "TokenizedCorpus":
        """Tokenize `documents` (lists of sentences, streamed) into `directory`. Sentences that
        give no token are skipped and counted; documents left with no sentence are dropped."""
        os.makedirs(directory, exist_ok=True)
        paths = {k: os.path.join(directory, f"{k}.bin") for k in ("tokens", "sentences", "documents")}
        counts = {"tokens": 0, "sentences": 0, "documents": 0, "empty_sentences": 0}
        f_tok = open(paths["tokens"], "wb")
        f_sent = open(paths["sentences"], "wb")
        f_doc = open(paths["documents"], "wb")
        np.zeros(1, np.int64).tofile(f_sent)
        np.zeros(1, np.int64).tofile(f_doc)
        pending: List[Tuple[int, str]] = []  # (document number in this batch, sentence)
        pending_docs = 0

        def flush():
            nonlocal pending, pending_docs
            if not pending:
                return
            enc = tokenizer.encode_batch([s for _, s in pending], add_special_tokens=False)
            per_doc = [0] * pending_docs
            sent_ends = []
            for (d, _), e in zip(pending, enc):
                ids = e.ids
                if not ids:
                    counts["empty_sentences"] += 1
                    continue
                np.asarray(ids, np.int32).tofile(f_tok)
                counts["tokens"] += len(ids)
                sent_ends.append(counts["tokens"])
                per_doc[d] += 1
            np.asarray(sent_ends, np.int64).tofile(f_sent)
            doc_ends = []
            for n in per_doc:
                if n:
                    counts["sentences"] += n
                    counts["documents"] += 1
                    doc_ends.append(counts["sentences"])
            np.asarray(doc_ends, np.int64).tofile(f_doc)
            if progress is not None:
                progress.update(len(pending))
            pending = []
            pending_docs = 0

        try:
            for doc in documents:
                for s in doc:
                    pending.append((pending_docs, s))
                pending_docs += 1
                if len(pending) >= batch_sentences:
                    flush()
            flush()
        finally:
            f_tok.close()
            f_sent.close()
            f_doc.close()
        with open(os.path.join(directory, "corpus.json"), "w", encoding="utf-8") as f:
            json.dump(counts, f)
        return cls(directory)


def _memmap(path: str, dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype)
    size = os.path.getsize(path)
    if size != count * np.dtype(dtype).itemsize:
        raise ValueError(f"fastbert: {path} holds {size} bytes, expected {count} values of {np.dtype(dtype).name}")
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


# --------------------------------------------------------------------------------------------
# pairs


@dataclass
class Instance:
    tokens_a: np.ndarray
    tokens_b: np.ndarray
    is_random_next: bool

    def input_ids(self, cls_id: int, sep_id: int, dtype=np.int32) -> np.ndarray:
        """[CLS] A [SEP] B [SEP], or [CLS] A [SEP] for a single segment (B empty)."""
        na, nb = len(self.tokens_a), len(self.tokens_b)
        out = np.empty(na + nb + (3 if nb else 2), dtype)
        out[0] = cls_id
        out[1:na + 1] = self.tokens_a
        out[na + 1] = sep_id
        if nb:
            out[na + 2:na + 2 + nb] = self.tokens_b
            out[-1] = sep_id
        return out

    @property
    def segment_a_length(self) -> int:
        """Tokens with segment id 0: [CLS] A [SEP] (all of a single segment)."""
        return len(self.tokens_a) + 2


@dataclass
class PairStats:
    instances: int = 0
    is_next: int = 0
    truncated: int = 0
    forced_not_next: int = 0  # NotNext draws the recipe forces (no continuation exists)
    repaid: int = 0  # NotNext draws turned into IsNext while NotNext pairs outnumbered IsNext ones

    def as_dict(self) -> dict:
        return dict(vars(self))


class PairMaker:
    """Makes the pairs of one split: documents `doc_ids` of `corpus`, NotNext partners drawn from
    the same split. Deterministic for a given seed.

    next_sentence=False makes single segments instead, for MLM without NSP (RoBERTa's
    DOC-SENTENCES): consecutive whole sentences of one document up to the target length (a sentence
    longer than max_seq_length - 2 tokens alone, cut at its end), written as [CLS] A [SEP]."""

    def __init__(
        self,
        corpus: TokenizedCorpus,
        doc_ids: Sequence[int],
        *,
        max_seq_length: int,
        short_seq_prob: float = 0.1,
        seed: int = 12345,
        next_sentence: bool = True,
    ):
        if max_seq_length < 5:
            raise ValueError(f"fastbert: max_seq_length {max_seq_length} is too short for [CLS] A [SEP] B [SEP] (>= 5)")
        if not 0.0 <= short_seq_prob <= 1.0:
            raise ValueError(f"fastbert: short_seq_prob must be in [0, 1], got {short_seq_prob}")
        self.corpus = corpus
        self.doc_ids = np.asarray(doc_ids, np.int64)
        self.next_sentence = next_sentence
        if next_sentence and len(self.doc_ids) < 2:
            raise ValueError(
                f"fastbert: the corpus has {len(self.doc_ids)} document(s); next-sentence prediction draws the "
                "second segment of NotNext pairs from a different document, so at least 2 are needed "
                "(separate documents with a blank line)"
            )
        self.max_tokens = max_seq_length - (3 if next_sentence else 2)
        self.short_seq_prob = short_seq_prob
        self.rng = random.Random(seed)
        self.stats = PairStats()

    def _other_document(self, doc: int) -> int:
        n = len(self.doc_ids)
        pos = self.rng.randrange(n - 1)
        other = int(self.doc_ids[pos])
        if other == doc:  # doc_ids holds each id once: the last one stands in for it
            other = int(self.doc_ids[n - 1])
        return other

    def _random_b(self, doc: int, target_b: int) -> np.ndarray:
        other = self.corpus.document(self._other_document(doc))
        start = self.rng.randrange(len(other))
        parts, n = [], 0
        for seg in other[start:]:
            parts.append(seg)
            n += len(seg)
            if n >= target_b:
                break
        return np.concatenate(parts)

    def _truncate(self, a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        la, lb = len(a), len(b)
        if la + lb <= self.max_tokens:
            return a, b
        self.stats.truncated += 1
        a0, a1, b0, b1 = 0, la, 0, lb
        while (a1 - a0) + (b1 - b0) > self.max_tokens:
            if a1 - a0 > b1 - b0:
                if self.rng.random() < 0.5:
                    a0 += 1
                else:
                    a1 -= 1
            else:
                if self.rng.random() < 0.5:
                    b0 += 1
                else:
                    b1 -= 1
        return a[a0:a1], b[b0:b1]

    def document_sequences(self, doc: int) -> Iterator[Instance]:
        """The single segments of one document (next_sentence=False)."""
        target = self._target()
        chunk: List[np.ndarray] = []
        length = 0
        for sent in self.corpus.document(doc):
            if chunk and length + len(sent) > target:
                yield self._single(chunk)
                chunk, length, target = [], 0, self._target()
            chunk.append(sent)
            length += len(sent)
        if chunk:
            yield self._single(chunk)

    def _target(self) -> int:
        if self.rng.random() < self.short_seq_prob:
            return self.rng.randint(2, self.max_tokens)
        return self.max_tokens

    def _single(self, chunk: List[np.ndarray]) -> Instance:
        a = np.concatenate(chunk)
        if len(a) > self.max_tokens:
            self.stats.truncated += 1
            a = a[:self.max_tokens]
        self.stats.instances += 1
        return Instance(a, a[:0], False)

    def document_instances(self, doc: int) -> Iterator[Instance]:
        if not self.next_sentence:
            yield from self.document_sequences(doc)
            return
        sents = self.corpus.document(doc)
        rng = self.rng
        target = self._target()
        chunk: List[np.ndarray] = []
        length = 0
        i = 0
        while i < len(sents):
            chunk.append(sents[i])
            length += len(sents[i])
            if i == len(sents) - 1 or length >= target:
                a_end = 1 if len(chunk) == 1 else rng.randint(1, len(chunk) - 1)
                a = np.concatenate(chunk[:a_end])
                is_random = rng.random() < 0.5
                can_continue = len(chunk) > 1 or i + 1 < len(sents)
                if not is_random and not can_continue:
                    is_random = True
                    self.stats.forced_not_next += 1
                elif (is_random and can_continue and self.stats.instances > 2 * self.stats.is_next
                      and rng.random() < 0.5):
                    is_random = False
                    self.stats.repaid += 1
                if is_random:
                    b = self._random_b(doc, max(1, target - len(a)))
                    i -= len(chunk) - a_end  # the unused sentences are read again
                elif len(chunk) > 1:
                    b = np.concatenate(chunk[a_end:])
                else:  # A took the whole chunk: B is what follows in the document
                    parts, n = [], 0
                    while i + 1 < len(sents) and (not parts or n < target - len(a)):
                        i += 1
                        parts.append(sents[i])
                        n += len(sents[i])
                    b = np.concatenate(parts)
                a, b = self._truncate(a, b)
                self.stats.instances += 1
                self.stats.is_next += not is_random
                yield Instance(a, b, is_random)
                chunk, length = [], 0
            i += 1

    def instances(self, dupe_factor: int = 1) -> Iterator[Instance]:
        """Every document's pairs, `dupe_factor` times over (each pass in a fresh random order of
        the documents, with fresh random choices)."""
        for _ in range(dupe_factor):
            order = list(self.doc_ids)
            self.rng.shuffle(order)
            for d in order:
                yield from self.document_instances(int(d))


def split_documents(n_docs: int, eval_fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """(train ids, held-out ids): a random eval_fraction of the documents held out, at least 2 of
    them when any are (NotNext pairs of the held-out split come from held-out documents), and at
    least 2 left for training. No held-out split when that cannot be had."""
    ids = np.arange(n_docs)
    n_eval = int(round(n_docs * eval_fraction)) if eval_fraction > 0 else 0
    if n_eval:
        n_eval = max(2, n_eval)
    if n_eval and n_docs - n_eval < 2:
        n_eval = 0
    if not n_eval:
        return ids, ids[:0]
    perm = np.random.default_rng(seed).permutation(n_docs)
    return np.sort(perm[n_eval:]), np.sort(perm[:n_eval])
