"""fastbert.masking: exact invariants on many random batches (both backends), the C++ kernel
bit-identical to the reference rule, determinism (seed, generator, thread count), statistics over
10^6 candidate tokens, word starts, and clear errors on bad input."""
import math

import pytest
import torch

from fastbert import backend as fb_backend
from fastbert import masking, reference
from tests.helpers.masking import (
    MASKING_BACKENDS,
    candidates,
    check_invariants,
    random_batch,
    require_masking,
    small_vocab,
)

V = 64  # vocabulary of the synthetic batches
MASK = 4
SPECIAL_IDS = (0, 1, 2, 3)  # [PAD], [UNK], [CLS], [SEP] of the synthetic batches


@pytest.fixture(params=MASKING_BACKENDS)
def impl(request):
    require_masking(request.param)
    return request.param


def _options(g):
    """Random masking options: probability, max_predictions, shares."""
    p = [0.15, 0.5, 1.0, 0.01, float(torch.rand(1, generator=g))][int(torch.randint(0, 5, (1,), generator=g))]
    maxp = [None, None, 1, 3, 20][int(torch.randint(0, 5, (1,), generator=g))]
    shares = [(0.8, 0.1), (1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (0.0, 0.0)]
    mask_p, rand_p = shares[int(torch.randint(0, 5, (1,), generator=g))]
    return dict(mlm_probability=p, max_predictions=maxp, mask_replace_prob=mask_p, random_replace_prob=rand_p)


SHAPES = [(5, 1), (3, 2), (9, 33), (4, 127), (2, 257), (16, 64), (1, 8)]


@pytest.mark.parametrize("selection", ["count", "bernoulli"])
@pytest.mark.parametrize("whole_words", [False, True], ids=["tokens", "words"])
def test_invariants_on_random_batches(impl, selection, whole_words):
    g = torch.Generator().manual_seed(1 + 2 * whole_words + (selection == "bernoulli"))
    for trial in range(40):
        rows, seq = SHAPES[trial % len(SHAPES)]
        ids, special, attention, starts = random_batch(g, rows, seq, V, special_ids=SPECIAL_IDS)
        opts = _options(g)
        explicit = trial % 2 == 0  # special ids given, or found at special / padding positions
        kw = dict(special_token_ids=SPECIAL_IDS) if explicit else {}
        ws = starts if whole_words else None
        masked, labels = masking.mask_tokens(
            ids, mask_token_id=MASK, vocab_size=V, special_tokens_mask=special, attention_mask=attention,
            word_start_mask=ws, seed=1000 + trial, selection=selection, backend=impl, **kw, **opts,
        )
        cand = candidates(ids, special, attention, SPECIAL_IDS if explicit else None)
        excluded = set(SPECIAL_IDS) | {MASK} if explicit else set(ids[~(attention.bool() & ~special)].tolist()) | {MASK}
        check_invariants(
            ids, masked, labels, cand, mask_token_id=MASK, vocab_size=V, excluded=excluded,
            mlm_probability=opts["mlm_probability"], max_predictions=opts["max_predictions"], word_start=ws,
            selection=selection,
        )


def test_cpp_is_bit_identical_to_the_reference():
    require_masking("cpp")
    g = torch.Generator().manual_seed(7)
    for trial in range(60):
        rows, seq = SHAPES[trial % len(SHAPES)]
        ids, special, attention, starts = random_batch(g, rows, seq, V, special_ids=SPECIAL_IDS)
        opts = _options(g)
        kw = dict(
            mask_token_id=MASK, vocab_size=V, special_tokens_mask=special if trial % 3 else None,
            attention_mask=attention if trial % 4 else None, word_start_mask=starts if trial % 2 else None,
            special_token_ids=SPECIAL_IDS if trial % 5 == 0 else None,
            selection="bernoulli" if trial % 7 == 3 else "count", seed=trial * 1_000_003, **opts,
        )
        a = masking.mask_tokens(ids, backend="cpp", **kw)
        b = masking.mask_tokens(ids, backend="torch", **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), f"trial {trial}: {kw}"


def test_bert_count_rule():
    count = reference.mlm_prediction_count
    assert count(0, 0.15) == 0
    assert count(5, 0.0) == 0
    assert count(1, 0.15) == 1 and count(3, 0.15) == 1  # at least one
    assert count(126, 0.15) == 19
    assert count(10, 0.15) == 2 and count(30, 0.15) == 4  # 1.5 -> 2, 4.5 -> 4: half to even
    assert count(510, 0.15) == 76 and count(1000, 0.15, 80) == 80  # Google: 20 at 128, 80 at 512
    assert count(126, 0.15, 20) == 19 and count(200, 0.15, 20) == 20
    assert count(5, 1.0) == 5 and count(5, 1.0, 0) == 0


def test_max_predictions_at_google_settings(impl):
    g = torch.Generator().manual_seed(3)
    for seq, maxp in ((128, 20), (512, 80)):
        ids = torch.randint(5, V, (4, seq), generator=g)
        _, labels = masking.mask_tokens(ids, mask_token_id=MASK, vocab_size=V, mlm_probability=0.5,
                                        max_predictions=maxp, seed=1, backend=impl)
        assert (labels != -100).sum(1).tolist() == [maxp] * 4


def test_every_row_with_a_candidate_predicts(impl):
    """Short rows (1-6 candidates) at p = 0.15 still predict one token; whole words of 3 tokens
    when the budget is 1 (the rule takes the first word rather than nothing)."""
    ids = torch.full((6, 8), 10)
    attention = (torch.arange(8)[None, :] < torch.arange(1, 7)[:, None]).long()
    _, labels = masking.mask_tokens(ids, mask_token_id=MASK, vocab_size=V, attention_mask=attention, seed=5,
                                    backend=impl)
    assert (labels != -100).sum(1).tolist() == [1] * 6
    starts = torch.zeros(6, 8, dtype=torch.bool)
    starts[:, ::3] = True  # words of 3 tokens
    _, labels = masking.mask_tokens(ids, mask_token_id=MASK, vocab_size=V, attention_mask=attention,
                                    word_start_mask=starts, seed=5, backend=impl)
    counts = (labels != -100).sum(1).tolist()
    assert all(c >= 1 for c in counts), counts
    # with max_predictions 2, a 3-token word is never taken: rows of one 3-token word predict nothing
    _, labels = masking.mask_tokens(ids[:1, :3], mask_token_id=MASK, vocab_size=V, word_start_mask=starts[:1, :3],
                                    max_predictions=2, seed=5, backend=impl)
    assert (labels == -100).all()


def test_whole_word_walk_skips_words_that_do_not_fit():
    walk = reference.mlm_walk
    # budget 3: the 4-token word is skipped, the 2-token and 1-token words fit
    assert walk([(0, 4), (6, 2), (10, 3), (20, 1)], 3) == [6, 7, 20]
    assert walk([(0, 1), (1, 1), (2, 1)], 2) == [0, 1]
    assert walk([(0, 2), (5, 2)], None) == [0, 1, 5, 6]
    assert reference.mlm_units([True, True, False, True, True, True], [True, False, False, True, False, True]) == [
        (0, 2), (3, 2), (5, 1)]
    # a continuation right after a non-candidate starts a word of its own
    assert reference.mlm_units([False, True, True], [False, False, False]) == [(1, 2)]


def test_seed_and_generator_determinism(impl):
    g = torch.Generator().manual_seed(11)
    ids, special, attention, starts = random_batch(g, 8, 40, V, special_ids=SPECIAL_IDS)
    kw = dict(mask_token_id=MASK, vocab_size=V, special_tokens_mask=special, attention_mask=attention, backend=impl)
    for ws in (None, starts):
        a = masking.mask_tokens(ids, generator=torch.Generator().manual_seed(5), word_start_mask=ws, **kw)
        b = masking.mask_tokens(ids, generator=torch.Generator().manual_seed(5), word_start_mask=ws, **kw)
        c = masking.mask_tokens(ids, generator=torch.Generator().manual_seed(6), word_start_mask=ws, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[1], c[1])
        torch.manual_seed(42)
        d = masking.mask_tokens(ids, word_start_mask=ws, **kw)
        torch.manual_seed(42)
        e = masking.mask_tokens(ids, word_start_mask=ws, **kw)
        assert torch.equal(d[0], e[0]) and torch.equal(d[1], e[1])
        # a generator's state moves on: two calls in a row differ
        gen = torch.Generator().manual_seed(5)
        f1 = masking.mask_tokens(ids, generator=gen, word_start_mask=ws, **kw)
        f2 = masking.mask_tokens(ids, generator=gen, word_start_mask=ws, **kw)
        assert not torch.equal(f1[1], f2[1])
        # a seed drawn from the generator is the same as that seed given directly
        s = masking.draw_seed(torch.Generator().manual_seed(5))
        h = masking.mask_tokens(ids, seed=s, word_start_mask=ws, **kw)
        assert torch.equal(a[0], h[0]) and torch.equal(a[1], h[1])
    # the input is never modified
    ids2 = ids.clone()
    masking.mask_tokens(ids, seed=1, **kw)
    assert torch.equal(ids, ids2)


def test_independent_of_thread_count():
    require_masking("cpp")
    g = torch.Generator().manual_seed(12)
    # large enough to be split (the kernel gives a thread at least 32768 tokens)
    batches = [random_batch(g, 1024, 128, V, special_ids=SPECIAL_IDS, p_pad_row=0.0),
               random_batch(g, 200, 512, V, special_ids=SPECIAL_IDS, p_pad_row=0.0)]
    before = torch.get_num_threads()
    try:
        for ids, special, attention, starts in batches:
            for kw in (dict(), dict(word_start_mask=starts), dict(selection="bernoulli")):
                results = []
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    results.append(masking.mask_tokens(
                        ids, mask_token_id=MASK, vocab_size=V, special_tokens_mask=special, attention_mask=attention,
                        seed=99, backend="cpp", **kw))
                for r in results[1:]:
                    assert torch.equal(r[0], results[0][0]) and torch.equal(r[1], results[0][1])
    finally:
        torch.set_num_threads(before)


def _long_batch(g, rows, seq, vocab_size, specials):
    """Rows of random lengths in [16, seq] with [CLS] ... [SEP] ... [SEP]; at least 10^6 candidates."""
    ids = torch.randint(len(specials) + 1, vocab_size, (rows, seq), generator=g)
    lengths = torch.randint(16, seq + 1, (rows,), generator=g)
    attention = torch.arange(seq)[None, :] < lengths[:, None]
    special = torch.zeros(rows, seq, dtype=torch.bool)
    special[:, 0] = True
    special[torch.arange(rows), lengths - 1] = True
    special[torch.arange(rows), lengths // 2] = True
    ids[special] = specials[-1]
    ids[~attention] = specials[0]
    return ids, special, attention


def test_statistics_over_a_million_candidates():
    """Selected share 0.15 +- 0.002 (count and Bernoulli selection, tokens and whole words) and the
    outcomes 0.8 / 0.1 / 0.1 +- 0.005 of the selected, over >= 10^6 candidate tokens (C++ kernel;
    the reference is bit-identical to it, test_cpp_is_bit_identical_to_the_reference).
    Bounds: Bernoulli share sd = sqrt(0.15 * 0.85 / 1e6) = 3.6e-4, so 0.002 is 5.6 sd; outcome
    shares over >= 1.5e5 selected have sd <= 1.1e-3 (0.8) and 7.8e-4 (0.1): 0.005 is >= 4.5 sd.
    The count rule's share is exact up to rounding per row (|error| <= 0.5 / 16 per row, averaging out)."""
    require_masking("cpp")
    vocab = 30522
    specials = (0, 100, 101, 102)  # [PAD], [UNK], [CLS], [SEP]
    mask = 103
    g = torch.Generator().manual_seed(2024)
    ids, special, attention = _long_batch(g, 7600, 256, vocab, specials)
    starts = torch.rand(ids.shape, generator=g) < 0.7
    cand = attention & ~special
    n = int(cand.sum())
    assert n >= 1_000_000
    for kw in (dict(), dict(selection="bernoulli"), dict(word_start_mask=starts),
               dict(word_start_mask=starts, selection="bernoulli")):
        masked, labels = masking.mask_tokens(
            ids, mask_token_id=mask, vocab_size=vocab, special_tokens_mask=special, attention_mask=attention,
            seed=7, backend="cpp", **kw)
        sel = labels != -100
        share = sel.sum().item() / n
        assert abs(share - 0.15) < 0.002, (kw, share)
        if not kw:  # the count rule exactly
            k = [reference.mlm_prediction_count(c, 0.15) for c in cand.sum(1).tolist()]
            assert sel.sum(1).tolist() == k
        m = sel.sum().item()
        to_mask = (masked[sel] == mask).sum().item() / m
        same = (masked[sel] == ids[sel]).sum().item() / m
        rand = 1.0 - to_mask - same
        assert abs(to_mask - 0.8) < 0.005, (kw, to_mask)
        assert abs(same - 0.1) < 0.005 and abs(rand - 0.1) < 0.005, (kw, same, rand)


def _chi2_critical(df, z=3.719):
    """Wilson-Hilferty approximation of the chi-square quantile at upper tail ~1e-4 (z = 3.719)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("explicit", [True, False], ids=["special_token_ids", "found_in_batch"])
def test_random_replacements_are_uniform_over_the_ordinary_vocabulary(explicit):
    """All selected tokens replaced at random (mask 0, random 1): about 1.5e5 draws over the 59
    ordinary ids of a 64-id vocabulary; no special id or [MASK] ever drawn; chi-square with 58
    degrees of freedom below its 1e-4 upper quantile (~107)."""
    require_masking("cpp")
    g = torch.Generator().manual_seed(5)
    ids, special, attention = _long_batch(g, 7600, 256, V, SPECIAL_IDS)
    ids[special] = torch.tensor(SPECIAL_IDS[1:])[torch.randint(0, 3, (int(special.sum()),), generator=g)]
    kw = dict(special_token_ids=SPECIAL_IDS) if explicit else {}
    masked, labels = masking.mask_tokens(
        ids, mask_token_id=MASK, vocab_size=V, special_tokens_mask=special, attention_mask=attention,
        mask_replace_prob=0.0, random_replace_prob=1.0, seed=3, backend="cpp", **kw)
    drawn = masked[labels != -100]
    assert drawn.numel() > 140_000
    counts = torch.bincount(drawn, minlength=V).double()
    excluded = list(SPECIAL_IDS) + [MASK]
    assert counts[excluded].sum() == 0
    ordinary = torch.tensor([i for i in range(V) if i not in excluded])
    expected = drawn.numel() / len(ordinary)
    chi2 = (((counts[ordinary] - expected) ** 2) / expected).sum().item()
    assert chi2 < _chi2_critical(len(ordinary) - 1), chi2


@pytest.mark.slow
def test_reference_statistics():
    """The reference rule on its own, smaller (it loops over rows in Python): ~7e4 candidates; the
    count rule exactly; outcome shares within 5 sd (sd <= 4e-3 for 0.8 and 3e-3 for 0.1 over >= 1e4
    selected); Bernoulli share within 5 sd (1.4e-3)."""
    g = torch.Generator().manual_seed(77)
    vocab, mask, specials = 30522, 103, (0, 100, 101, 102)
    ids, special, attention = _long_batch(g, 1000, 128, vocab, specials)
    cand = attention & ~special
    n = cand.sum().item()
    kw = dict(mask_token_id=mask, vocab_size=vocab, special_tokens_mask=special, attention_mask=attention, seed=1)
    masked, labels = reference.mask_tokens(ids, **kw)
    sel = labels != -100
    assert sel.sum(1).tolist() == [reference.mlm_prediction_count(c, 0.15) for c in cand.sum(1).tolist()]
    assert abs(sel.sum().item() / n - 0.15) < 0.002
    m = sel.sum().item()
    assert m >= 10_000
    to_mask = (masked[sel] == mask).sum().item() / m
    same = (masked[sel] == ids[sel]).sum().item() / m
    assert abs(to_mask - 0.8) < 0.02 and abs(same - 0.1) < 0.015 and abs(1 - to_mask - same - 0.1) < 0.015
    _, labels_b = reference.mask_tokens(ids, selection="bernoulli", **kw)
    assert abs((labels_b != -100).sum().item() / n - 0.15) < 0.007


def test_mask_dtypes_and_layouts_agree(impl):
    g = torch.Generator().manual_seed(21)
    ids, special, attention, starts = random_batch(g, 6, 30, V, special_ids=SPECIAL_IDS)
    kw = dict(mask_token_id=MASK, vocab_size=V, seed=4, backend=impl)
    base = masking.mask_tokens(ids, special_tokens_mask=special, attention_mask=attention, word_start_mask=starts, **kw)
    for dt in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32):
        r = masking.mask_tokens(ids.to(torch.int32), special_tokens_mask=special.to(dt),
                                attention_mask=attention.to(dt), word_start_mask=starts.to(dt), **kw)
        assert torch.equal(r[0], base[0]) and torch.equal(r[1], base[1]), dt
    # non-contiguous inputs
    t = lambda x: x.t().contiguous().t()  # noqa: E731
    r = masking.mask_tokens(t(ids), special_tokens_mask=t(special), attention_mask=t(attention),
                            word_start_mask=t(starts), **kw)
    assert torch.equal(r[0], base[0]) and torch.equal(r[1], base[1])


def test_empty_batches(impl):
    for shape in ((0, 5), (3, 0), (0, 0)):
        m, lab = masking.mask_tokens(torch.zeros(shape, dtype=torch.int64), mask_token_id=MASK, vocab_size=V,
                                     seed=0, backend=impl)
        assert m.shape == lab.shape == shape and m.dtype == lab.dtype == torch.int64


def test_word_starts(impl):
    tokens, _ = small_vocab()
    table = masking.word_start_table(tokens, backend=impl)
    assert table.dtype == torch.bool and table.shape == (len(tokens),)
    assert torch.equal(table, reference.word_start_table(tokens))
    assert table[tokens.index("w3")] and not table[tokens.index("##p2")] and table[tokens.index("[CLS]")]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, len(tokens), (7, 45), generator=g)
    ws = masking.word_starts(ids, table, backend=impl)
    assert torch.equal(ws, reference.word_starts(ids, table))
    assert torch.equal(ws, torch.tensor([[not tokens[i].startswith("##") for i in row] for row in ids.tolist()]))
    # a vocabulary as a list, a {token: id} dict or a vocab.txt path gives the same
    assert torch.equal(masking.word_starts(ids, tokens, backend=impl), ws)
    assert torch.equal(masking.word_starts(ids, {t: i for i, t in enumerate(tokens)}, backend=impl), ws)
    with pytest.raises(ValueError, match="outside|must be in"):
        masking.word_starts(torch.tensor([[0, len(tokens)]]), table, backend=impl)
    with pytest.raises(ValueError, match="outside|must be in"):
        masking.word_starts(torch.tensor([[-1, 0]]), table, backend=impl)
    with pytest.raises(TypeError, match="integer"):
        masking.word_starts(torch.zeros(2, 2), table, backend=impl)


def test_word_start_table_from_a_vocab_file(tmp_path):
    tokens, _ = small_vocab()
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    assert torch.equal(masking.word_start_table(str(path)), reference.word_start_table(tokens))


BAD_INPUTS = [
    (dict(input_ids=torch.zeros(2, 3)), TypeError, "integer"),
    (dict(input_ids=torch.zeros(2, 3, dtype=torch.bool)), TypeError, "integer"),
    (dict(input_ids=[[1, 2]]), TypeError, "torch.Tensor"),
    (dict(input_ids=torch.zeros(3, dtype=torch.int64)), ValueError, r"\[batch, seq\]"),
    (dict(input_ids=torch.tensor([[1, V]])), ValueError, "outside"),
    (dict(input_ids=torch.tensor([[1, -1]])), ValueError, "outside"),
    (dict(mlm_probability=1.5), ValueError, "mlm_probability"),
    (dict(mlm_probability=-0.1), ValueError, "mlm_probability"),
    (dict(mlm_probability=float("nan")), ValueError, "mlm_probability"),
    (dict(mask_replace_prob=1.2), ValueError, "mask_replace_prob"),
    (dict(random_replace_prob=-0.5), ValueError, "random_replace_prob"),
    (dict(mask_replace_prob=0.8, random_replace_prob=0.3), ValueError, "at most 1"),
    (dict(special_tokens_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError, "shape"),
    (dict(attention_mask=torch.ones(3, 3, dtype=torch.int64)), ValueError, "shape"),
    (dict(word_start_mask=torch.ones(2, dtype=torch.bool)), ValueError, "shape"),
    (dict(attention_mask=torch.full((2, 3), 0.5)), ValueError, "0 and 1"),
    (dict(mask_token_id=V), ValueError, "mask_token_id"),
    (dict(mask_token_id=-1), ValueError, "mask_token_id"),
    (dict(mask_token_id=1.5), TypeError, "mask_token_id"),
    (dict(vocab_size=0), ValueError, "vocab_size"),
    (dict(max_predictions=-1), ValueError, "max_predictions"),
    (dict(selection="uniform"), ValueError, "selection"),
    (dict(special_token_ids=[0, V]), ValueError, "outside"),
    (dict(seed=-3), ValueError, "seed"),
    (dict(seed=1, generator=torch.Generator()), ValueError, "not both"),
]


@pytest.mark.parametrize("bad,exc,match", BAD_INPUTS, ids=[str(i) for i in range(len(BAD_INPUTS))])
def test_bad_input_gets_a_clear_error(impl, bad, exc, match):
    kw = dict(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10]]), mask_token_id=MASK, vocab_size=V)
    kw.update(bad)
    with pytest.raises(exc, match=match):
        masking.mask_tokens(kw.pop("input_ids"), backend=impl, **kw)


def test_no_ordinary_id_left_is_an_error(impl):
    with pytest.raises(ValueError, match="ordinary"):
        masking.mask_tokens(torch.tensor([[0, 1]]), mask_token_id=1, vocab_size=2, special_token_ids=[0],
                            mlm_probability=1.0, mask_replace_prob=0.0, random_replace_prob=1.0, seed=0, backend=impl)


def test_the_kernel_checks_a_direct_call():
    """fastbert._C.mask_tokens rejects bad arguments itself (ValueError / TypeError), never crashes."""
    require_masking("cpp")
    ext = fb_backend.cpp_extension()

    ids = torch.tensor([[5, 6, 7]])
    args = lambda **o: dict(dict(input_ids=ids, special_tokens_mask=None, attention_mask=None,  # noqa: E731
                                 word_start_mask=None, special_token_ids=None, mask_token_id=MASK, vocab_size=V,
                                 mlm_probability=0.15, mask_replace_prob=0.8, random_replace_prob=0.1,
                                 max_predictions=-1, seed=1, bernoulli=False), **o)
    with pytest.raises(ValueError, match="outside"):
        ext.mask_tokens(**args(input_ids=torch.tensor([[5, 99]])))
    with pytest.raises(TypeError, match="int64"):
        ext.mask_tokens(**args(input_ids=ids.to(torch.int32)))
    with pytest.raises(ValueError, match="shape"):
        ext.mask_tokens(**args(attention_mask=torch.ones(1, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="at most 1"):
        ext.mask_tokens(**args(mask_replace_prob=0.9, random_replace_prob=0.2))
    with pytest.raises(ValueError, match="mask_token_id"):
        ext.mask_tokens(**args(mask_token_id=V))
