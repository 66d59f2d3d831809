"""Shared pieces of the masking and collator tests: the masking backends, random batches with
special tokens, padding and words, a small WordPiece vocabulary, and the exact invariants every
masked batch must satisfy."""
import math
import os

import pytest
import torch

from fastbert import backend as fb_backend
from fastbert import reference

MASKING_BACKENDS = ["cpp", "torch"]


def require_masking(backend):
    """Skip when `backend` cannot mask here (FASTBERT_REQUIRE_ALL_BACKENDS=1, as in CI: fail)."""
    if backend != "cpp":
        return
    ext = fb_backend.cpp_extension()
    why = None
    if ext is None:
        why = "the C++ extension fastbert._C is not built"
    elif not hasattr(ext, "mask_tokens"):
        why = "the built fastbert._C predates the masking kernels (rebuild it)"
    if why is None:
        return
    if os.environ.get("FASTBERT_REQUIRE_ALL_BACKENDS") == "1":
        pytest.fail(f"backend 'cpp' is required here but unavailable: {why}")
    pytest.skip(why)


def small_vocab(words=40, pieces=20):
    """A BERT-like WordPiece vocabulary: [PAD] [unused0..4] [UNK] [CLS] [SEP] [MASK], then whole-word
    tokens and "##" continuations. Returns (tokens, {name: id} of the specials)."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [f"w{i}" for i in range(words)] + [f"##p{i}" for i in range(pieces)]
    special = {t: tokens.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    return tokens, special


def random_batch(g, rows, seq, vocab_size, *, special_ids=(), pad_id=0, p_special=0.05, p_pad_row=0.1):
    """(ids, special_tokens_mask, attention_mask, word_start_mask) of a random [rows, seq] batch:
    random lengths (some rows all padding, some of length 1), special tokens at the ends and at
    random places (holding ids from special_ids when given), words of 1 to 4 tokens."""
    ids = torch.randint(0, vocab_size, (rows, seq), generator=g)
    lengths = torch.randint(0, seq + 1, (rows,), generator=g)
    lengths[torch.rand(rows, generator=g) < p_pad_row] = 0
    if rows > 1:
        lengths[1] = min(1, seq)
    attention = torch.arange(seq)[None, :] < lengths[:, None]
    special = torch.rand(rows, seq, generator=g) < p_special
    special[:, 0] = True
    last = (lengths - 1).clamp(min=0)
    special[torch.arange(rows), last] = True
    special &= attention
    if special_ids:
        choice = torch.tensor(list(special_ids))[torch.randint(0, len(special_ids), (rows, seq), generator=g)]
        ids = torch.where(special, choice, ids)
        ordinary = torch.tensor([i for i in range(vocab_size) if i not in set(special_ids)])
        ids = torch.where(~special & torch.isin(ids, torch.tensor(list(special_ids))),
                          ordinary[torch.randint(0, len(ordinary), (rows, seq), generator=g)], ids)
    ids = torch.where(attention, ids, torch.full_like(ids, pad_id))
    word_start = torch.rand(rows, seq, generator=g) < 0.55
    return ids, special, attention.to(torch.int64), word_start


def candidates(ids, special, attention, special_ids=None):
    cand = attention.bool() & ~special.bool()
    if special_ids is not None:
        cand &= ~torch.isin(ids, torch.tensor(list(special_ids), dtype=torch.int64))
    return cand


def words_of_row(cand_row, start_row):
    return reference.mlm_units(cand_row.tolist(), None if start_row is None else start_row.tolist())


def check_invariants(ids, masked, labels, cand, *, mask_token_id, vocab_size, excluded, mlm_probability,
                     max_predictions=None, word_start=None, selection="count"):
    """The exact invariants of a masked batch (see the rule in fastbert.reference)."""
    assert masked.dtype == torch.int64 and labels.dtype == torch.int64
    assert masked.shape == ids.shape == labels.shape
    sel = labels != reference.MLM_IGNORE_INDEX
    # never a special token or padding
    assert not (sel & ~cand).any(), "a special or padding token was selected"
    # labels: the original id where selected (and -100 exactly elsewhere, by the definition of sel)
    assert torch.equal(labels[sel], ids[sel])
    # tokens not selected are untouched
    assert torch.equal(masked[~sel], ids[~sel])
    # a changed token became [MASK] or an ordinary id
    changed = sel & (masked != ids)
    vals = masked[changed]
    assert ((vals >= 0) & (vals < vocab_size)).all()
    excluded = torch.as_tensor(sorted(set(excluded)), dtype=torch.int64)
    assert ((vals == mask_token_id) | ~torch.isin(vals, excluded)).all(), "a random replacement drew a special id"
    counts = sel.sum(1).tolist()
    n_cand = cand.sum(1).tolist()
    for b in range(ids.shape[0]):
        units = None
        if word_start is not None:
            units = words_of_row(cand[b], word_start[b])
            for first, length in units:  # whole words: all or nothing
                s = sel[b, first : first + length]
                assert s.all() or not s.any(), f"row {b}: word at {first} (length {length}) partly selected"
        if selection == "count":
            k = reference.mlm_prediction_count(n_cand[b], mlm_probability, max_predictions)
            if word_start is None:
                assert counts[b] == k, f"row {b}: {counts[b]} selected, the rule says {k}"
            elif counts[b] > k:  # only when every word is longer than k: then exactly one word
                assert all(length > k for _, length in units), f"row {b}: {counts[b]} > k = {k}"
                assert sum(1 for f, _length in units if sel[b, f]) == 1
            else:
                # the walk skips a word only when it does not fit: every word left out is too long
                for first, length in units:
                    if not sel[b, first]:
                        assert length > k - counts[b], f"row {b}: word at {first} fits but was skipped"
                if k > 0 and n_cand[b] > 0:
                    limit = math.inf if max_predictions is None else max_predictions
                    if any(length <= limit for _, length in units):
                        assert counts[b] >= 1, f"row {b}: nothing to predict"
        elif max_predictions is not None:
            assert counts[b] <= max_predictions
    return sel
