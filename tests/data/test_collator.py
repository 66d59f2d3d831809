"""fastbert.data.PretrainingCollator: padding, masks and labels, the unpadded layout (the same batch
as fastbert.ops.unpad of the padded one), whole-word masking, determinism and input errors."""
import pytest
import torch

import fastbert.ops
from fastbert import masking, reference
from fastbert.data import PretrainingCollator
from tests.helpers.masking import check_invariants, require_masking, small_vocab


@pytest.fixture(autouse=True)
def _needs_cpp():
    require_masking("cpp")


TOKENS, SPECIAL = small_vocab()
V = len(TOKENS)
FIRST_WORD, FIRST_PIECE = TOKENS.index("w0"), TOKENS.index("##p0")


def make_features(g, n, *, max_len=40, tensors=False, nsp=True, types=True):
    """Sentence pairs [CLS] A [SEP] B [SEP] of WordPiece-like ids (words of a start token and 0-2 pieces)."""
    feats = []
    for _ in range(n):
        la, lb = (int(x) for x in torch.randint(1, max(2, (max_len - 3) // 2 + 1), (2,), generator=g))
        def sent(length):
            out = []
            while len(out) < length:
                out.append(FIRST_WORD + int(torch.randint(0, 40, (1,), generator=g)))
                for _ in range(int(torch.randint(0, 3, (1,), generator=g))):
                    out.append(FIRST_PIECE + int(torch.randint(0, 20, (1,), generator=g)))
            return out[:length]
        a, b = sent(la), sent(lb)
        ids = [SPECIAL["[CLS]"]] + a + [SPECIAL["[SEP]"]] + b + [SPECIAL["[SEP]"]]
        tt = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        f = {"input_ids": torch.tensor(ids) if tensors else ids}
        if types:
            f["token_type_ids"] = torch.tensor(tt) if tensors else tt
        if nsp:
            f["next_sentence_label"] = int(torch.randint(0, 2, (1,), generator=g))
        feats.append(f)
    return feats


def collator(**kw):
    kw.setdefault("seed", 0)
    return PretrainingCollator.from_vocab(TOKENS, **kw)


def test_padded_batch_layout_and_labels():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        feats = make_features(g, 1 + trial % 9, max_len=5 + 7 * trial)
        batch = collator(seed=trial)(feats)
        lengths = [len(f["input_ids"]) for f in feats]
        seq = -(-max(lengths) // 8) * 8
        n = len(feats)
        assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
        for key in ("input_ids", "token_type_ids", "attention_mask", "labels"):
            assert batch[key].shape == (n, seq) and batch[key].dtype == torch.int64, key
        assert seq % 8 == 0 and seq - max(lengths) < 8
        real = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]
        assert torch.equal(batch["attention_mask"], real.long())
        orig = torch.zeros(n, seq, dtype=torch.int64)
        types = torch.zeros(n, seq, dtype=torch.int64)
        for i, f in enumerate(feats):
            orig[i, : lengths[i]] = torch.tensor(f["input_ids"])
            types[i, : lengths[i]] = torch.tensor(f["token_type_ids"])
        assert torch.equal(batch["token_type_ids"], types)
        assert (batch["input_ids"][~real] == SPECIAL["[PAD]"]).all()
        assert torch.equal(batch["next_sentence_label"], torch.tensor([f["next_sentence_label"] for f in feats]))
        special_ids = sorted(SPECIAL.values())
        cand = real & ~torch.isin(orig, torch.tensor(special_ids))
        check_invariants(orig, batch["input_ids"], batch["labels"], cand, mask_token_id=SPECIAL["[MASK]"],
                         vocab_size=V, excluded=special_ids, mlm_probability=0.15)


def test_lists_and_tensors_give_the_same_batch():
    feats = make_features(torch.Generator().manual_seed(1), 12)
    as_tensors = [{k: torch.tensor(v) if isinstance(v, list) else v for k, v in f.items()} for f in feats]
    a, b = collator(seed=3)(feats), collator(seed=3)(as_tensors)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_unpadded_output_is_unpad_of_the_padded_batch():
    g = torch.Generator().manual_seed(2)
    for wwm in (False, True):
        feats = make_features(g, 11, max_len=60)
        padded = collator(seed=8, whole_word_mask=wwm)(feats)
        packed = collator(seed=8, whole_word_mask=wwm, unpadded=True)(feats)
        assert set(packed) == {"input_ids", "token_type_ids", "labels", "position_ids", "indices", "cu_seqlens",
                               "max_seqlen", "next_sentence_label"}
        mask = padded["attention_mask"]
        ids, indices, cu_seqlens, max_seqlen = fastbert.ops.unpad(padded["input_ids"].unsqueeze(-1), mask)
        assert torch.equal(packed["input_ids"], ids.squeeze(-1))
        assert torch.equal(packed["indices"], indices)
        assert packed["cu_seqlens"].dtype == torch.int32 and torch.equal(packed["cu_seqlens"], cu_seqlens)
        assert packed["max_seqlen"] == max_seqlen == max(len(f["input_ids"]) for f in feats)
        lengths = [len(f["input_ids"]) for f in feats]
        assert torch.equal(packed["position_ids"], torch.cat([torch.arange(n) for n in lengths]))
        for key in ("labels", "token_type_ids"):
            assert torch.equal(packed[key], fastbert.ops.unpad(padded[key].unsqueeze(-1), mask)[0].squeeze(-1))
        assert torch.equal(packed["next_sentence_label"], padded["next_sentence_label"])


def test_whole_word_masking_selects_whole_words():
    g = torch.Generator().manual_seed(4)
    c = collator(seed=5, whole_word_mask=True, max_predictions=20)
    table = reference.word_start_table(TOKENS)
    for _ in range(10):
        feats = make_features(g, 16, max_len=70)
        batch = c(feats)
        lengths = [len(f["input_ids"]) for f in feats]
        seq = batch["input_ids"].shape[1]
        orig = torch.zeros(len(feats), seq, dtype=torch.int64)
        for i, f in enumerate(feats):
            orig[i, : lengths[i]] = torch.tensor(f["input_ids"])
        real = batch["attention_mask"].bool()
        cand = real & ~torch.isin(orig, torch.tensor(sorted(SPECIAL.values())))
        check_invariants(orig, batch["input_ids"], batch["labels"], cand, mask_token_id=SPECIAL["[MASK]"],
                         vocab_size=V, excluded=SPECIAL.values(), mlm_probability=0.15, max_predictions=20,
                         word_start=table[orig])


def test_seeded_collators_repeat_and_differ():
    feats = make_features(torch.Generator().manual_seed(6), 20)
    a, b, c = collator(seed=1), collator(seed=1), collator(seed=2)
    a1, a2, b1, b2, c1 = a(feats), a(feats), b(feats), b(feats), c(feats)
    assert torch.equal(a1["labels"], b1["labels"]) and torch.equal(a2["labels"], b2["labels"])
    assert not torch.equal(a1["labels"], a2["labels"])  # each batch draws a new seed
    assert not torch.equal(a1["labels"], c1["labels"])
    gen = torch.Generator().manual_seed(1)
    d = PretrainingCollator.from_vocab(TOKENS, generator=gen)
    assert torch.equal(d(feats)["labels"], a1["labels"])


def test_options():
    feats = make_features(torch.Generator().manual_seed(7), 9, nsp=False, types=False)
    batch = collator(pad_to_multiple_of=1)(feats)
    assert "next_sentence_label" not in batch
    assert batch["input_ids"].shape[1] == max(len(f["input_ids"]) for f in feats)
    assert (batch["token_type_ids"] == 0).all()
    b = collator(mlm_probability=1.0, max_predictions=3)(feats)
    assert ((b["labels"] != -100).sum(1) == 3).all()
    b = collator(mlm_probability=0.5, selection="bernoulli", mask_replace_prob=1.0, random_replace_prob=0.0)(feats)
    sel = b["labels"] != -100
    assert (b["input_ids"][sel] == SPECIAL["[MASK]"]).all()


def test_from_vocab_file_and_explicit_construction(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(TOKENS) + "\n", encoding="utf-8")
    feats = make_features(torch.Generator().manual_seed(8), 5)
    a = PretrainingCollator.from_vocab(str(path), seed=4, whole_word_mask=True)(feats)
    b = PretrainingCollator(
        vocab_size=V, mask_token_id=SPECIAL["[MASK]"], pad_token_id=SPECIAL["[PAD]"],
        special_token_ids=[SPECIAL[t] for t in ("[CLS]", "[SEP]", "[UNK]")], whole_word_mask=True,
        word_start_table=masking.word_start_table(TOKENS), seed=4,
    )(feats)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_bad_input():
    c = collator()
    with pytest.raises(ValueError, match="empty"):
        c([])
    with pytest.raises(ValueError, match="input_ids"):
        c([{"token_type_ids": [0, 0]}])
    with pytest.raises(ValueError, match="token_type_ids"):
        c([{"input_ids": [7, 10, 8], "token_type_ids": [0, 0]}])
    with pytest.raises(ValueError, match="next_sentence_label"):
        c([{"input_ids": [7, 10, 8], "next_sentence_label": 0}, {"input_ids": [7, 11, 8]}])
    with pytest.raises(ValueError, match="outside"):
        c([{"input_ids": [7, V + 5, 8]}])
    with pytest.raises((TypeError, ValueError)):
        c([{"input_ids": [7.5, 10, 8]}])
    with pytest.raises(ValueError, match="word_start_table"):
        PretrainingCollator(vocab_size=V, mask_token_id=8, whole_word_mask=True)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        collator(pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="mlm_probability"):
        collator(mlm_probability=2.0)
    with pytest.raises(ValueError, match="lacks"):
        PretrainingCollator.from_vocab(["[PAD]", "a", "b"])


def test_same_batch_without_the_extension(monkeypatch):
    """Without fastbert._C the collator pads in numpy and masks with the reference: the same batch."""
    feats = make_features(torch.Generator().manual_seed(9), 7)
    mixed = [dict(f, input_ids=torch.tensor(f["input_ids"])) if i % 2 else f for i, f in enumerate(feats)]
    expected = collator(seed=2, whole_word_mask=True)(feats)
    assert all(torch.equal(expected[k], v) for k, v in collator(seed=2, whole_word_mask=True)(mixed).items())
    c = collator(seed=2, whole_word_mask=True)
    monkeypatch.setattr(fastbert.backend, "cpp_extension", lambda: None)
    got = c(feats)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    with pytest.raises(TypeError, match="not integers"):
        c([{"input_ids": [7.5, 10, 8]}])
