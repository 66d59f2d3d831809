"""Sentence pairs: the IsNext share, where B comes from, truncation, [CLS] / [SEP] and segment ids."""
import numpy as np
import pytest

from fastbert.data.instances import PairMaker, TokenizedCorpus, split_documents

CLS, SEP = 2, 3


class _Tok:
    """A stand-in tokenizer: a 'sentence' is a string of space-separated integer ids."""

    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode_batch(self, texts, add_special_tokens=False):
        return [self._Enc([int(t) for t in s.split()]) for s in texts]


def synthetic_corpus(tmp_path, n_docs=300, seed=0):
    """Documents of 1..12 sentences of 1..40 tokens. Token id = 1_000_000 + doc * 1000 + sentence * 50 + k,
    so every token tells which document, sentence and place it came from."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        n_sent = int(rng.integers(1, 13))
        doc = []
        for s in range(n_sent):
            n_tok = int(rng.integers(1, 41))
            doc.append(" ".join(str(1_000_000 + d * 1000 + s * 50 + k) for k in range(n_tok)))
        docs.append(doc)
    return TokenizedCorpus.build(docs, _Tok(), str(tmp_path / "tok"))


def origin(tok):
    t = int(tok) - 1_000_000
    return t // 1000, (t % 1000) // 50, t % 50  # document, sentence, place


def test_is_next_share_is_one_half_and_not_next_never_from_the_same_document(tmp_path):
    corpus = synthetic_corpus(tmp_path)
    maker = PairMaker(corpus, np.arange(corpus.num_documents), max_seq_length=64, short_seq_prob=0.1, seed=1)
    pairs = list(maker.instances(dupe_factor=10))
    assert len(pairs) > 5000
    share = np.mean([not p.is_random_next for p in pairs])
    assert abs(share - 0.5) <= 0.02, share
    assert maker.stats.forced_not_next > 0  # the corpus has one-sentence chunks at document ends
    for p in pairs:
        a_docs = {origin(t)[0] for t in p.tokens_a}
        b_docs = {origin(t)[0] for t in p.tokens_b}
        assert len(a_docs) == 1 and len(b_docs) == 1
        if p.is_random_next:
            assert a_docs != b_docs, "NotNext B from A's own document"
        else:
            assert a_docs == b_docs
            # B continues A: its first sentence comes after A's last
            last_a = max(origin(t)[1] for t in p.tokens_a)
            first_b = min(origin(t)[1] for t in p.tokens_b)
            assert first_b > last_a


def test_pairs_fit_and_carry_cls_sep_and_segment_ids(tmp_path):
    corpus = synthetic_corpus(tmp_path, n_docs=80, seed=3)
    for max_len in (8, 17, 32, 128):
        maker = PairMaker(corpus, np.arange(corpus.num_documents), max_seq_length=max_len, short_seq_prob=0.3, seed=max_len)
        n_trunc = 0
        for p in maker.instances(dupe_factor=2):
            ids = p.input_ids(CLS, SEP, np.int64)
            assert len(ids) <= max_len
            assert len(p.tokens_a) >= 1 and len(p.tokens_b) >= 1
            a = p.segment_a_length
            assert ids[0] == CLS and ids[a - 1] == SEP and ids[-1] == SEP
            assert (ids[1:a - 1] == p.tokens_a).all() and (ids[a:-1] == p.tokens_b).all()
            assert not np.isin(ids[1:a - 1], [CLS, SEP]).any() and not np.isin(ids[a:-1], [CLS, SEP]).any()
            types = np.zeros(len(ids), np.int64)
            types[a:] = 1
            assert types[0] == 0 and types[a - 1] == 0 and types[-1] == 1
            # truncation drops tokens only at the ends of A and B: what is left is contiguous
            for seg in (p.tokens_a, p.tokens_b):
                o = [origin(t) for t in seg]
                same_sentence_steps = [(x, y) for x, y in zip(o, o[1:]) if x[1] == y[1]]
                assert all(y[2] == x[2] + 1 for x, y in same_sentence_steps)
        n_trunc += maker.stats.truncated
        if max_len <= 32:
            assert maker.stats.truncated > 0


def test_short_seq_prob_makes_shorter_pairs(tmp_path):
    corpus = synthetic_corpus(tmp_path, n_docs=100, seed=4)
    lengths = {}
    for p in (0.0, 1.0):
        maker = PairMaker(corpus, np.arange(100), max_seq_length=128, short_seq_prob=p, seed=0)
        lengths[p] = np.mean([len(x.tokens_a) + len(x.tokens_b) for x in maker.instances(2)])
    assert lengths[1.0] < 0.8 * lengths[0.0]


def test_dupe_factor_and_determinism(tmp_path):
    corpus = synthetic_corpus(tmp_path, n_docs=50, seed=5)
    one = list(PairMaker(corpus, np.arange(50), max_seq_length=64, seed=9).instances(1))
    three = list(PairMaker(corpus, np.arange(50), max_seq_length=64, seed=9).instances(3))
    again = list(PairMaker(corpus, np.arange(50), max_seq_length=64, seed=9).instances(3))
    assert 2.5 * len(one) < len(three) < 3.5 * len(one)
    assert all((x.tokens_a == y.tokens_a).all() and (x.tokens_b == y.tokens_b).all() for x, y in zip(three, again))


def test_one_document_is_an_error(tmp_path):
    corpus = synthetic_corpus(tmp_path, n_docs=1)
    with pytest.raises(ValueError, match="at least 2"):
        PairMaker(corpus, [0], max_seq_length=64)


def test_split_documents_holds_out_whole_documents():
    train, held = split_documents(100, 0.1, seed=0)
    assert len(held) == 10 and len(train) == 90 and not set(train) & set(held)
    train, held = split_documents(3, 0.1, seed=0)  # too few for a held-out split
    assert len(held) == 0 and len(train) == 3
