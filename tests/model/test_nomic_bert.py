"""NomicBERT beside transformers' NomicBERT classes (the parity of every class, output and gradient,
checkpoints both ways, int8 and partial checkpoints run in tests/model/test_families.py with the
other families): the files in the original model's names as transformers writes them, no biases,
SwiGLU with left padding, the config's defaults and head_dim."""
import pytest
import torch

import fastbert
from tests.helpers.bert import TOL
from tests.helpers.families import batch, pair

transformers = pytest.importorskip("transformers")


def test_files_in_the_original_names(tmp_path):
    """transformers writes Wqkv, out_proj, fc11 / fc12 / fc2, norm1 / norm2, emb_ln: fastbert writes the
    same keys and tensors, and reads them back."""
    from safetensors.torch import load_file

    hm, fm = pair("nomic_bert", "NomicBertForMaskedLM", tmp_path / "hf")
    fm.save_pretrained(str(tmp_path / "fb"))
    theirs, ours = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "fb"))
    assert sorted(ours) == sorted(theirs)
    assert any(k.endswith("attn.Wqkv.weight") for k in ours) and any(".mlp.fc11." in k for k in ours)
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), k
    assert not any(k.endswith("proj.bias") for k in dict(fm.nomic_bert.layers.named_parameters()))  # (norms have theirs)


def test_left_padded_swiglu_matches_transformers():
    hm, fm = pair("nomic_bert", "NomicBertModel")
    assert fm.config.hidden_act == "silu"
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10]])
    mask = (torch.arange(6)[None] >= torch.tensor([[2], [0]])).long()
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        got = fm(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    g = torch.Generator().manual_seed(4)
    ids, mask, tt = batch("nomic_bert", 3, 10, g)
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state[mask.bool()]
        got = fm(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state[mask.bool()]
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_config_defaults_and_head_dim():
    ours, theirs = fastbert.NomicBertConfig(), transformers.NomicBertConfig()
    for field in ("vocab_size", "hidden_size", "hidden_act", "type_vocab_size", "max_position_embeddings", "pad_token_id",
                  "layer_norm_eps", "hidden_dropout_prob"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 1000.0
    assert fastbert.NomicBertConfig(**theirs.to_dict()).head_dim == theirs.head_dim == 64
    with pytest.raises(ValueError, match="head_dim 32 is not hidden_size / num_attention_heads"):
        fastbert.NomicBertConfig(head_dim=32)
