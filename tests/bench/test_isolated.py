"""bench_encoder --isolate: each provider timed alone in a child process of its own."""
import pytest
import torch

from fastbert.bench.isolated import isolated_times, peer_of
from fastbert.bench.workloads import arch_config, make_batch


def test_a_provider_is_timed_in_a_child_with_only_its_own_peer():
    assert peer_of("onnxruntime int8") == ["onnxruntime"]
    assert peer_of("torch.compile fp32") == ["torch.compile"]
    assert peer_of("fastbert fp32") == [] and peer_of("GEMM floor fp32 dot") == []


@pytest.mark.slow
def test_isolated_times_gathers_every_pass_of_every_provider():
    cfg = arch_config("bert", 1)
    ids, mask = make_batch(2, 4, 8, torch.Generator().manual_seed(0), cfg.vocab_size, cfg.pad_token_id)
    times = isolated_times(["fastbert fp32", "transformers sdpa fp32"], 1, [torch.float32], ids, mask, "bert",
                           calls=3, passes=2, progress=False)
    assert {k: len(v) for k, v in times.items()} == {"fastbert fp32": 6, "transformers sdpa fp32": 6}
    assert all(0 < t < 60 for v in times.values() for t in v)
