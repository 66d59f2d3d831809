"""What keeping a model's layer tensors between forwards (fastbert.model.stack_plan) costs and saves:
for a BERT-base stack (12 layers, random weights), fp32 and int8, the microseconds a forward spends
  - checking the kept plan (every attribute it was read from still the same object), and
  - reading every layer's tensors afresh (BertLayer.weights() and the joined QKV parts, per layer),
the simpler mechanism that would need nothing kept, beside the whole forward on one 20-token query
(one20), where the difference shows most. Each figure is the median of --rounds rounds, the two
mechanisms timed in turn in every round.

    python benchmarks/bench_stack_plan.py [--rounds 7] [--json PATH]
"""
from __future__ import annotations

import statistics
import time

import torch

import fastbert
from fastbert.bench.report import add_output_options, finish, parser
from fastbert.bench.workloads import WORKLOADS, make_batch
from fastbert.model import stack_plan

CONFIG = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)


def per_call(f, seconds: float = 0.2) -> float:
    """Seconds a call of f, over a batch of calls filling about `seconds`."""
    f()
    t0 = time.perf_counter()
    f()
    once = max(time.perf_counter() - t0, 1e-7)
    n = max(3, int(seconds / once))
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def read_afresh(layers, int8: bool) -> list:
    """Every layer's tensors as the stack call takes them, read from the modules now."""
    names = ("weight", "weight_scale", "bias") if int8 else ("weight", "bias")
    out = []
    for layer in layers:
        sa = layer.self_attention
        parts = [getattr(m, name) for name in names for m in (sa.query, sa.key, sa.value)]
        out.append([*layer.weights(), *parts])
    return out


def measure_one(quantize, rounds: int, ids, mask) -> dict:
    torch.manual_seed(0)
    model = fastbert.BertModel(fastbert.BertConfig(**CONFIG)).eval()
    if quantize:
        model.quantize_(quantize)
    layers, int8 = tuple(model.layers), quantize is not None
    kept, fresh, forward = [], [], []
    with torch.no_grad():
        model(ids, mask)  # measures the GEMM paths, builds the plan
        for _ in range(rounds):
            kept.append(per_call(lambda: stack_plan.plan(model, layers, int8)))
            fresh.append(per_call(lambda: read_afresh(layers, int8)))
            forward.append(per_call(lambda: model(ids, mask), 1.0))
    k, f, fw = (statistics.median(x) * 1e6 for x in (kept, fresh, forward))
    return {"precision": quantize or "fp32", "plan_check_us": k, "read_afresh_us": f, "one20_forward_us": fw}


def measure(rounds: int) -> list:
    spec = WORKLOADS["one20"]
    ids, mask = make_batch(spec["batch"], spec["lo"], spec["hi"], torch.Generator().manual_seed(0))
    return [measure_one(quantize, rounds, ids, mask) for quantize in (None, "int8")]


def print_rows(rows) -> None:
    print(f"{torch.get_num_threads()} threads; BERT-base, 12 layers; one20: one sequence of 20 tokens")
    print("| precision | check the kept plan, us | read every layer afresh, us | one20 forward, us | afresh / forward |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['precision']} | {r['plan_check_us']:.0f} | {r['read_afresh_us']:.0f} | {r['one20_forward_us']:.0f} | "
              f"{r['read_afresh_us'] / r['one20_forward_us']:.1%} |")


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=7)
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    finish(measure(args.rounds), print_rows, argv, json_path=args.json)


if __name__ == "__main__":
    main()
