"""torch.profiler names fastbert's fused kernels (fastbert::<op>_fwd / _bwd), forward and backward."""
import torch
from conftest import require

import fastbert


def test_a_profile_names_the_fused_ops():
    require("cpp")
    cfg = fastbert.BertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = fastbert.BertModel(cfg).train()
    ids = torch.randint(1, 97, (3, 16))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.profiler.profile() as prof:
        model(ids, mask).last_hidden_state.sum().backward()
    names = {e.key for e in prof.key_averages() if e.key.startswith("fastbert::")}
    for op in ("add_layer_norm", "bias_gelu", "varlen_attention"):
        assert {f"fastbert::{op}_fwd", f"fastbert::{op}_bwd"} <= names, names
