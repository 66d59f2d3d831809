"""torch.profiler names fastbert's fused kernels (fastbert::<op>_fwd / _bwd), forward and backward."""
import torch

import fastbert
from tests.helpers.backends import require


def test_a_profile_names_the_fused_ops():
    require("cpp")
    shape = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128)
    model = fastbert.BertModel(fastbert.BertConfig(vocab_size=97, **shape)).train()
    mask = (torch.arange(16)[None] < torch.tensor([[16], [8], [12]])).long()  # rows of 16, 8 and 12 tokens
    with torch.profiler.profile() as prof:
        model(torch.randint(1, 97, mask.shape) * mask, mask).last_hidden_state.sum().backward()
    names = {e.key for e in prof.key_averages() if e.key.startswith("fastbert::")}
    for op in ("add_layer_norm", "bias_gelu", "varlen_attention"):
        assert {f"fastbert::{op}_fwd", f"fastbert::{op}_bwd"} <= names, names
