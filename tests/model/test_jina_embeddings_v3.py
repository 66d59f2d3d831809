"""Jina embeddings v3 beside transformers' classes (every class's parity, output and gradient,
checkpoints both ways, int8 and partial checkpoints run in tests/model/test_families.py with the
other families): the files in the original model's names as transformers writes them, the rotary
positions under left padding, the first-token classifier on every token (rotary), the config."""
import pytest
import torch

import fastbert
from tests.helpers.bert import TOL
from tests.helpers.families import pair

transformers = pytest.importorskip("transformers")


def test_files_in_the_original_names(tmp_path):
    from safetensors.torch import load_file

    hm, fm = pair("jina_embeddings_v3", "JinaEmbeddingsV3ForMaskedLM", tmp_path / "hf")
    fm.save_pretrained(str(tmp_path / "fb"))
    theirs, ours = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "fb"))
    assert sorted(ours) == sorted(theirs) and any(k.endswith("mixer.Wqkv.weight") for k in ours)
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), k


def test_left_padding_and_the_sequence_classifier_match_transformers():
    """Left padding (rotary: distances only) at every real token, and RoBERTa's first-token classifier
    (right padding: its first token is a real one), which runs its last layer at every token here
    (first_tokens takes absolute positions)."""
    hm, fm = pair("jina_embeddings_v3", "JinaEmbeddingsV3ForSequenceClassification")
    left = torch.tensor([[1, 1, 0, 6, 7, 2], [0, 6, 7, 8, 9, 2]])
    mask = (left != 1).long()
    with torch.no_grad():
        want, got = (m.roberta(input_ids=left, attention_mask=mask).last_hidden_state[mask.bool()] for m in (hm, fm))
        torch.testing.assert_close(got, want, **TOL[torch.float32])
        right = torch.tensor([[0, 6, 7, 2, 1, 1], [0, 6, 7, 8, 9, 2]])
        mask = (right != 1).long()
        want, got = (m(input_ids=right, attention_mask=mask).logits for m in (hm, fm))
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_config_defaults():
    ours, theirs = fastbert.JinaEmbeddingsV3Config(), transformers.JinaEmbeddingsV3Config()
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 20000.0
