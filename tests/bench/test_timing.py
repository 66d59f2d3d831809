"""The machine's rates the kernel benchmarks print their figures beside, and the FLOPs they count."""
import importlib.util
import os

import torch

from fastbert.bench.timing import memory_bandwidth


def _bench(name):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memory_bandwidth_is_a_rate():
    gbs = memory_bandwidth(nbytes=8 << 20, repeats=2)
    assert 0.1 < gbs < 10_000


def test_attention_pair_flops_count_the_window():
    bench = _bench("bench_modern_attention")
    per_pair = 4 * bench.HEAD_DIM * bench.HEADS
    lengths = torch.tensor([5, 3])
    assert bench.pair_flops(lengths, None, False) == per_pair * (25 + 9)
    # window 1: a query sees itself and one key either side, fewer at the ends
    assert bench.pair_flops(lengths, 1, False) == per_pair * ((2 + 3 + 3 + 3 + 2) + (2 + 3 + 2))
    # a window past the sequence sees every key
    assert bench.pair_flops(lengths, 10, False) == bench.pair_flops(lengths, None, False)
    assert bench.pair_flops(lengths, None, True) == 3.5 * bench.pair_flops(lengths, None, False)


def test_runs_call_each_contender_in_a_row_and_leave_the_first_call_untimed():
    from fastbert.bench.timing import interleaved_cpu_times

    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "ab"}
    times = interleaved_cpu_times(fns, warmup=1, repeats=2, runs=3, settle_s=0.001)
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4}  # 2 rounds x (3 calls - 1 untimed)
    assert "".join(calls) == "ab" + "aaabbb" * 2


def test_encoder_flops_count_geglu_and_the_local_layers_window():
    import transformers

    from fastbert.bench.timing import encoder_flops

    lengths = [5, 3]
    modern = transformers.ModernBertConfig(hidden_size=8, intermediate_size=12, num_hidden_layers=3,
                                           num_attention_heads=2, local_attention=2)
    assert modern.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    products = 2 * (4 * 8 * 8 + 3 * 8 * 12) * 8 * 3  # GeGLU: 8 -> 2 x 12, then 12 -> 8
    # layer 0 global (every pair), layers 1 and 2 local: a window of 1 either side
    attention = 4 * 8 * ((25 + 9) + 2 * ((2 + 3 + 3 + 3 + 2) + (2 + 3 + 2)))
    assert encoder_flops(modern, lengths) == products + attention
    mpnet = transformers.MPNetConfig(hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2)
    assert encoder_flops(mpnet, lengths) == 2 * (4 * 8 * 8 + 2 * 8 * 12) * 8 * 2 + 4 * 8 * (25 + 9) * 2
