"""Vocabulary trainers that give the same vocabulary for the same words on every run.

    count_words(texts, tokenizer)                -> {word: count}, as a tokenizers pipeline splits the texts
    wordpiece_vocab(counts, vocab_size, ...)     -> tokens in id order (BERT's WordPiece vocabularies)
    unigram_pieces(counts, vocab_size, ...)      -> [(piece, log probability)] (sentencepiece's Unigram model)

WordPiece: a byte-pair-encoding-style training over the words. A word starts as its characters, the
first one as itself and every later one with the continuation prefix ("##"); the alphabet is the
`limit_alphabet` most frequent characters (others split a word and are never merged). Each step
merges the most frequent adjacent pair into a new token ("ab" + "##cd" -> "abcd", "##ab" + "##cd" ->
"##abcd") until the vocabulary is full or the best pair is rarer than min_frequency. Pair counts are
kept up to date incrementally (pair -> count, pair -> words holding it, a heap whose stale entries are
refreshed when they surface), so a step costs the words it changes, not the whole corpus.

Unigram: seed pieces are every character and the most frequent substrings of the words (up to 16
characters, ranked by count x length); rounds of hard EM follow (each word cut into its most likely
pieces by tokenizers' Unigram model, counts weighted by the word's frequency, log(count / total) as
the new score), each round dropping the least used quarter of the pieces longer than one character,
until the pieces fit the vocabulary.

Every choice between equals follows an explicit total order, never the iteration order of a dict
or a set (which for strings changes with the process's hash seed): words are visited sorted; the
pair merged is the one with the highest count, then the smallest merged string, then the smallest
(left, right) strings; seeds, characters and pruned pieces are ranked by count (or score)
descending, then by the string; all sums are of integers; the Unigram segmenter is rebuilt from
pieces in sorted order.
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from itertools import chain
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

MAX_PIECE_LENGTH = 16


class EmptyCorpusError(ValueError):
    """The texts held no word to train a vocabulary on."""


def count_words(texts: Iterable[str], tokenizer) -> Dict[str, int]:
    """{word: count} of `texts` (any iterable of strings, read once) as the tokenizers `tokenizer`
    splits them: each text normalised by its normaliser, then split by its pre-tokeniser."""
    if tokenizer.pre_tokenizer is None:
        raise ValueError("fastbert: count_words needs a tokenizer with a pre-tokenizer")
    normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer is not None else None
    split = tokenizer.pre_tokenizer.pre_tokenize_str
    counts: Dict[str, int] = {}
    get = counts.get
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"fastbert: the texts to count must be str, got {type(text).__name__}")
        for word, _ in split(normalize(text) if normalize is not None else text):
            counts[word] = get(word, 0) + 1
    return counts


def _sorted_words(counts: Dict[str, int]) -> Tuple[List[str], List[int]]:
    words = sorted(w for w, c in counts.items() if w and c > 0)
    if not words:
        raise EmptyCorpusError("fastbert: the corpus has no text to train a vocabulary on (no word once normalised)")
    return words, [int(counts[w]) for w in words]


def _ranked(counts: Dict[str, int]) -> List[str]:
    """The keys by count descending, then by the string."""
    return sorted(counts, key=lambda k: (-counts[k], k))


def _top(counts: Dict[str, int], k: int) -> List[str]:
    """The k keys of highest count (ties: the smaller strings), in no particular order; as
    _ranked(counts)[:k], without sorting all the keys."""
    if len(counts) <= k:
        return list(counts)
    if k <= 0:
        return []
    cutoff = sorted(counts.values(), reverse=True)[k - 1]
    above = [s for s, c in counts.items() if c > cutoff]
    return above + sorted(s for s, c in counts.items() if c == cutoff)[:k - len(above)]


def _char_counts(words: Sequence[str], freqs: Sequence[int]) -> Dict[str, int]:
    chars: Dict[str, int] = {}
    for w, f in zip(words, freqs):
        for ch in w:
            chars[ch] = chars.get(ch, 0) + f
    return chars


# --------------------------------------------------------------------------------------- WordPiece


def _initial_symbols(words: Sequence[str], freqs: Sequence[int], limit_alphabet: Optional[int], room: int,
                     prefix: str) -> List[str]:
    """The single-character tokens: every alphabet character as itself and, where it occurs inside a
    word, with the prefix; the most used `room` of them when there are more. Word-initial forms
    first, then the continuations, each sorted."""
    chars = _char_counts(words, freqs)
    alphabet = set(_ranked(chars)[:limit_alphabet] if limit_alphabet is not None else chars)
    used = {ch: 0 for ch in alphabet}
    for w, f in zip(words, freqs):
        for i, ch in enumerate(w):
            if ch in alphabet:
                s = prefix + ch if i else ch
                used[s] = used.get(s, 0) + f
    kept = _ranked(used)[:room]
    return sorted(kept, key=lambda s: (len(s) > 1, s))


def _merged(left: str, right: str, prefix: str) -> str:
    return left + (right[len(prefix):] if prefix and right.startswith(prefix) else right)


def _merge_word(sym: List[int], a: int, b: int, new: int) -> List[int]:
    out: List[int] = []
    i, n = 0, len(sym)
    while i < n:
        if i + 1 < n and sym[i] == a and sym[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(sym[i])
            i += 1
    return out


def _pairs_of(sym: List[int]) -> Dict[Tuple[int, int], int]:
    """Adjacent pairs of a word (-1 marks a character outside the alphabet: no pair spans it)."""
    out: Dict[Tuple[int, int], int] = {}
    for p in zip(sym, sym[1:]):
        if p[0] >= 0 and p[1] >= 0:
            out[p] = out.get(p, 0) + 1
    return out


class _Pairs:
    """The adjacent token pairs of all words: count, the words holding them, and a heap of
    (-count, merged string, left, right, ids) whose stale entries are refreshed when they surface."""

    def __init__(self, words: List[List[int]], freqs: List[int], names: List[str], prefix: str):
        self.words, self.freqs, self.names, self.prefix = words, freqs, names, prefix
        self.count: Dict[Tuple[int, int], int] = {}
        self.where: Dict[Tuple[int, int], Set[int]] = {}
        for wi, sym in enumerate(words):
            for p, n in _pairs_of(sym).items():
                self.count[p] = self.count.get(p, 0) + n * freqs[wi]
                self.where.setdefault(p, set()).add(wi)
        # entries are distinct or equal as tuples, so the order of pops does not depend on this list's order
        self.heap = [self._entry(p, c) for p, c in self.count.items()]
        heapq.heapify(self.heap)

    def _entry(self, p: Tuple[int, int], c: int):
        left, right = self.names[p[0]], self.names[p[1]]
        return (-c, _merged(left, right, self.prefix), left, right, p[0], p[1])

    def best(self):
        """(pair, merged string, count) of the most frequent pair, or None when there is none."""
        while self.heap:
            neg, merged, _, _, a, b = heapq.heappop(self.heap)
            c = self.count.get((a, b), 0)
            if c == -neg:
                return (a, b), merged, c
            if c > 0:
                heapq.heappush(self.heap, self._entry((a, b), c))
        return None

    def merge(self, pair: Tuple[int, int], new: int) -> None:
        grown: Set[Tuple[int, int]] = set()
        for wi in self.where.pop(pair, ()):  # int members: the result does not depend on this order
            old_sym, f = self.words[wi], self.freqs[wi]
            new_sym = _merge_word(old_sym, pair[0], pair[1], new)
            old, now = _pairs_of(old_sym), _pairs_of(new_sym)
            for p, n in old.items():
                self.count[p] -= n * f
                if p not in now and p != pair:
                    self.where[p].discard(wi)
            for p, n in now.items():
                self.count[p] = self.count.get(p, 0) + n * f
                self.where.setdefault(p, set()).add(wi)
                if n > old.get(p, 0):
                    grown.add(p)
            self.words[wi] = new_sym
        self.count.pop(pair, None)
        for p in grown:
            if self.count.get(p, 0) > 0:
                heapq.heappush(self.heap, self._entry(p, self.count[p]))


def wordpiece_vocab(counts: Dict[str, int], vocab_size: int, *, special_tokens: Sequence[str], min_frequency: int = 2,
                    limit_alphabet: Optional[int] = 1000, prefix: str = "##") -> List[str]:
    """A WordPiece vocabulary (tokens in id order, the special tokens first) of at most vocab_size
    tokens for the words `counts` ({word: count}, as count_words gives)."""
    specials = list(dict.fromkeys(special_tokens))
    if vocab_size < len(specials) + 1:
        raise ValueError(f"fastbert: vocab_size {vocab_size} is too small (at least {len(specials) + 1}: the "
                         f"{len(specials)} special tokens and one more)")
    words, freqs = _sorted_words(counts)
    names = specials + [s for s in _initial_symbols(words, freqs, limit_alphabet, vocab_size - len(specials), prefix)
                        if s not in specials]
    index = {s: i for i, s in enumerate(names)}
    seqs = [[index.get(prefix + ch if i else ch, -1) for i, ch in enumerate(w)] for w in words]
    pairs = _Pairs(seqs, freqs, names, prefix)
    while len(names) < vocab_size:
        found = pairs.best()
        if found is None or found[2] < min_frequency:
            break
        pair, merged, _ = found
        new = index.get(merged)
        if new is None:
            new = index[merged] = len(names)
            names.append(merged)
        pairs.merge(pair, new)
    return names


# ----------------------------------------------------------------------------------------- Unigram


def _seed_pieces(words: Sequence[str], freqs: Sequence[int], chars: Dict[str, int], complete: bool, max_length: int,
                 seed_size: int) -> Dict[str, float]:
    """{piece: log probability}: every character of `chars` (by its count) and the `seed_size`
    substrings of 2 .. max_length characters seen at least twice with the highest count x length
    (made of those characters only, unless `complete` says they are all the corpus has)."""
    def substrings(w: str) -> List[str]:
        n = len(w)
        return [w[i:j] for i in range(n - 1) for j in range(i + 2, min(n, i + max_length) + 1)]

    # words seen once (most of them) counted at C speed, the others weighted by their count
    subs = Counter(chain.from_iterable(substrings(w) for w, f in zip(words, freqs) if f == 1))
    get = subs.get
    for w, f in zip(words, freqs):
        if f != 1:
            for s in substrings(w):
                subs[s] = get(s, 0) + f
    weight = {s: c * len(s) for s, c in subs.items() if c >= 2 and (complete or all(ch in chars for ch in s))}
    seeds = {s: weight[s] for s in _top(weight, seed_size)}
    seeds.update(chars)
    return _log_probs(seeds, set())


def _log_probs(counts: Dict[str, int], floor_for: Set[str]) -> Dict[str, float]:
    """log(count / total) of the pieces used; the pieces of `floor_for` that were not get
    log(0.5 / total), below every used one; other unused pieces are dropped."""
    total = sum(counts.values())  # integers: exact in any order
    floor = math.log(0.5 / total)
    out = {p: math.log(c / total) for p, c in counts.items() if c > 0}
    out.update({p: floor for p in floor_for if counts.get(p, 0) <= 0})
    return out


class _Segmenter:
    """The words cut into their most likely pieces by tokenizers' Unigram model (Viterbi)."""

    def __init__(self, words: List[str], freqs: List[int]):
        self.words, self.freqs = words, freqs
        unk = "\x00"
        while any(unk in w for w in words):  # a placeholder no word can match
            unk += "\x00"
        self.unk = unk

    def counts(self, pieces: Dict[str, float]) -> Dict[str, int]:
        """{piece: the number of times it is used}, each word weighted by its frequency."""
        from tokenizers import Tokenizer, models

        names = sorted(pieces)
        model = models.Unigram([(self.unk, 0.0)] + [(p, pieces[p]) for p in names], unk_id=0, byte_fallback=False)
        tok = Tokenizer(model)
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        hits = [0] * (len(names) + 1)
        for enc, f in zip(encode(self.words, add_special_tokens=False), self.freqs):
            for i in enc.ids:
                hits[i] += f
        return {p: hits[i + 1] for i, p in enumerate(names)}


def _prune(pieces: Dict[str, float], used: Dict[str, int], size: int) -> Dict[str, float]:
    """The single characters and the most used longer pieces, `size` in all."""
    singles = [p for p in pieces if len(p) == 1]
    longer = sorted((p for p in pieces if len(p) > 1), key=lambda p: (-used.get(p, 0), p))
    keep = singles + longer[:max(0, size - len(singles))]
    return {p: pieces[p] for p in keep}


def unigram_pieces(counts: Dict[str, int], vocab_size: int, *, n_special: int, max_piece_length: int = MAX_PIECE_LENGTH,
                   seed_size: int = 1_000_000, shrinking_factor: float = 0.75,
                   em_iterations: int = 2) -> List[Tuple[str, float]]:
    """[(piece, log probability)] of a Unigram model with at most vocab_size - n_special pieces for
    the words `counts` (as count_words gives, pre-tokenized with their "▁" marks), by score
    descending, then by piece. Every character is a piece unless there are more characters than
    room, when the rarest are left out."""
    target = vocab_size - n_special
    if target < 1:
        raise ValueError(f"fastbert: vocab_size {vocab_size} is too small (at least {n_special + 1}: the "
                         f"{n_special} special tokens and one piece)")
    if not 0.0 < shrinking_factor < 1.0:
        raise ValueError(f"fastbert: shrinking_factor must be in (0, 1), got {shrinking_factor}")
    words, freqs = _sorted_words(counts)
    chars = _char_counts(words, freqs)
    kept_chars = {ch: chars[ch] for ch in _ranked(chars)[:target]}
    pieces = _seed_pieces(words, freqs, kept_chars, len(kept_chars) == len(chars), max_piece_length, seed_size)
    segmenter = _Segmenter(words, freqs)
    while True:
        for _ in range(max(1, em_iterations)):
            used = segmenter.counts(pieces)
            pieces = _log_probs(used, set(kept_chars))
        if len(pieces) <= target:
            break
        pieces = _prune(pieces, used, max(target, int(len(pieces) * shrinking_factor)))
    return sorted(pieces.items(), key=lambda kv: (-kv[1], kv[0]))
