"""BGE-M3's sparse lexical weights and ColBERT multi-vectors (fastbert.token_outputs, through
SentenceEncoder.encode(output=...)) against BGE-M3's own computation (FlagEmbedding's
BGEM3FlagModel, written out here on transformers' XLM-R) on the same random weights, on Korean and
English text; the scores; the errors."""
import os

import numpy as np
import pytest
import torch

import fastbert
from fastbert import token_outputs
from tests.helpers.st_dirs import KOREAN, bge_m3_directory, splade_directory

pytest.importorskip("sentence_transformers")
SENTENCES = KOREAN[:12] + ["The model reads Korean text such as 한국어 문장.", "짧다", "서울 서울 서울역 서울",
                           "a short line of text " * 9]


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    return bge_m3_directory(tmp_path_factory.mktemp("m3"))


def flag_embedding_m3(path, sentences):
    """BGEM3FlagModel.encode's three outputs, as FlagEmbedding computes them (fp32): the dense CLS
    vector normalised; per text {token id: the largest relu(sparse_linear(h)) of its occurrences},
    cls / eos / pad / unk and zeros left out; colbert_linear(h[:, 1:]) times the mask, normalised,
    the first (tokens - 1) rows."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    sparse, colbert = torch.nn.Linear(64, 1), torch.nn.Linear(64, 64)
    sparse.load_state_dict(torch.load(os.path.join(path, "sparse_linear.pt")))
    colbert.load_state_dict(torch.load(os.path.join(path, "colbert_linear.pt")))
    unused = {tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    dense, lexical, multi, distinct = [], [], [], []
    with torch.no_grad():
        for s in sentences:
            enc = tok([s], return_tensors="pt", truncation=True, max_length=512)
            h = model(**enc).last_hidden_state
            dense.append(torch.nn.functional.normalize(h[:, 0], dim=-1)[0].numpy())
            weights = torch.relu(sparse(h))[0, :, 0]
            result = {}
            for w, idx in zip(weights.tolist(), enc["input_ids"][0].tolist()):
                if idx not in unused and w > 0 and w > result.get(idx, 0):
                    result[idx] = w
            lexical.append(result)
            distinct.append(len(set(enc["input_ids"][0].tolist()) - unused))
            vecs = colbert(h[:, 1:]) * enc["attention_mask"][:, 1:][:, :, None].float()
            vecs = torch.nn.functional.normalize(vecs, dim=-1)[0]
            multi.append(vecs[: int(enc["attention_mask"].sum()) - 1].numpy())
    return np.stack(dense), lexical, multi, distinct


@pytest.mark.parametrize("batch_size", [1, 5])
def test_the_three_outputs_are_bge_m3s(m3, batch_size):
    dense, lexical, multi, distinct = flag_embedding_m3(m3, SENTENCES)
    got = fastbert.SentenceEncoder(m3).encode(SENTENCES, batch_size=batch_size, output="all")
    np.testing.assert_allclose(got["dense"], dense, atol=2e-5, rtol=1e-4)
    assert len(got["sparse"]) == len(got["colbert"]) == len(SENTENCES)
    for (ids, weights), want, vecs, want_vecs in zip(got["sparse"], lexical, got["colbert"], multi):
        assert ids.dtype == np.int64 and weights.dtype == np.float32 and np.all(np.diff(ids) > 0)
        assert sorted(want) == ids.tolist()
        np.testing.assert_allclose(weights, [want[i] for i in ids.tolist()], atol=2e-5, rtol=1e-4)
        assert vecs.dtype == np.float32 and vecs.shape == want_vecs.shape
        np.testing.assert_allclose(vecs, want_vecs, atol=2e-5, rtol=1e-4)
    # the weights spread: some tokens kept, some zero after the ReLU (else the test would prove little)
    assert any(len(w) for w in lexical) and any(len(w) < n for w, n in zip(lexical, distinct))


def test_each_output_alone_is_the_same_as_all(m3):
    enc = fastbert.SentenceEncoder(m3)
    every = enc.encode(SENTENCES, batch_size=4, output="all")
    np.testing.assert_array_equal(enc.encode(SENTENCES, batch_size=4), every["dense"])
    for (ids, w), (ids2, w2) in zip(enc.encode(SENTENCES, batch_size=4, output="sparse"), every["sparse"]):
        np.testing.assert_array_equal(ids, ids2)
        np.testing.assert_array_equal(w, w2)
    for a, b in zip(enc.encode(SENTENCES, batch_size=4, output="colbert"), every["colbert"]):
        np.testing.assert_array_equal(a, b)
    one = enc.encode("서울 서울 서울역 서울", output="all", convert_to_tensor=True)
    assert one["dense"].shape == (64,) and isinstance(one["sparse"][0], torch.Tensor)
    assert one["colbert"].shape[1] == 64


def test_scores_of_a_korean_query_against_passages(m3):
    # The sparse score sums the products of the weights of the ids both texts have: the passage that
    # shares the query's words scores by those, the English one only by what it shares (the
    # metaspace piece, in some vocabularies). Which of the two ranks first is the weights' business:
    # random weights, and a Unigram vocabulary whose training is not deterministic, do not decide it.
    enc = fastbert.SentenceEncoder(m3)
    query, near, far = "서울역 근처 식당", "서울역 근처에 식당이 많다", "The model reads a sentence"
    out = enc.encode([query, near, far], output="all")
    s = out["sparse"]
    as_dict = [dict(zip(ids.tolist(), w.tolist())) for ids, w in s]
    for other in (1, 2):
        want = sum(w * as_dict[other][i] for i, w in as_dict[0].items() if i in as_dict[other])
        assert token_outputs.sparse_score(s[0], s[other]) == pytest.approx(want, rel=1e-12, abs=1e-15)
    ids = [set(t) for t in enc.tokenize([query, near, far])]
    assert (ids[0] & ids[1]) - ids[2], "the Korean passage shares word pieces with the query that the English one lacks"
    c = out["colbert"]
    assert token_outputs.colbert_score(c[0], c[0]) == pytest.approx(1.0, abs=1e-5)
    assert token_outputs.colbert_score(c[0], c[1]) <= 1.0 + 1e-5
    ids, w = s[0]
    assert token_outputs.sparse_score(s[0], s[0]) == pytest.approx(float((w.astype(np.float64) ** 2).sum()))
    assert token_outputs.sparse_score(s[0], (ids[::-1].copy(), w[::-1].copy())) == pytest.approx(
        token_outputs.sparse_score(s[0], s[0]))


def test_a_model_without_the_heads_says_which_file_it_lacks(tmp_path):
    only_sparse = bge_m3_directory(tmp_path, colbert=False)
    enc = fastbert.SentenceEncoder(only_sparse)
    assert len(enc.encode(["서울"], output="sparse")) == 1
    with pytest.raises(ValueError, match="colbert_linear.pt"):
        enc.encode(["서울"], output="colbert")
    with pytest.raises(ValueError, match="colbert_linear.pt"):
        enc.encode(["서울"], output="all")
    with pytest.raises(ValueError, match="output must be one of"):
        enc.encode(["서울"], output="lexical")


def test_a_head_of_the_wrong_width_is_refused(tmp_path):
    path = bge_m3_directory(tmp_path)
    torch.save(torch.nn.Linear(32, 1).state_dict(), os.path.join(path, "sparse_linear.pt"))
    with pytest.raises(ValueError, match=r"sparse_linear.pt must hold a linear layer's weight \[out, 64\]"):
        fastbert.SentenceEncoder(path)


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    return splade_directory(tmp_path_factory.mktemp("splade"))


def test_splade_gives_sentence_transformers_sparse_vectors(splade):
    from sentence_transformers import SparseEncoder

    want = SparseEncoder(splade, device="cpu").encode(SENTENCES, batch_size=4).to_dense().numpy()
    enc = fastbert.SentenceEncoder(splade)
    assert enc.dim == want.shape[1]
    got = enc.encode(SENTENCES, batch_size=3)  # a SPLADE model's default output: sparse
    assert len(got) == len(SENTENCES)
    for (ids, weights), row in zip(got, want):
        assert ids.dtype == np.int64 and weights.dtype == np.float32 and np.all(np.diff(ids) > 0)
        assert np.all(weights > 0)
        dense = np.zeros_like(row)
        dense[ids] = weights
        # fp32 rounding of logits of a few units (these weights are drawn wide): 1e-4 apart; a
        # vocabulary entry whose logit is that close to 0 may be in one vector and not the other
        np.testing.assert_allclose(dense, row, atol=3e-4, rtol=1e-4)
    assert min(len(ids) for ids, _ in got) > 0 and max(len(ids) for ids, _ in got) < want.shape[1]
    ids, weights = enc.encode("서울역 근처 식당", output="sparse", convert_to_tensor=True)
    assert isinstance(ids, torch.Tensor) and token_outputs.sparse_score((ids, weights), (ids, weights)) > 0
    with pytest.raises(ValueError, match="SPLADE model gives sparse vectors only"):
        enc.encode(["서울"], output="dense")
