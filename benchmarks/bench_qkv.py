"""The QKV projection for inference, three ways, on the model's shapes: one GEMM on the
concatenated weight that the three projections' parameters are slices of (what fastbert runs: no
copy, never stale), one GEMM on a concatenation made on every call, and three GEMMs.

    python benchmarks/bench_qkv.py [--rounds 15]

Each row times the projection of every layer of a model (BERT-base: 12 x hidden 768; MiniLM:
6 x 384) for one batch of `tokens` rows, through fastbert.ops.linear; the providers are called in
turn, round after round, and the ratio is of their medians, measured in the same run.
"""
import argparse
import statistics

import torch

import fastbert
from fastbert.bench.report import command_line, header, without_slow_bf16
from fastbert.bench.timing import interleaved_cpu_times

CASES = [(2370, 768, 12), (4096, 768, 12), (256, 768, 12), (64, 384, 6), (16, 384, 6)]


def providers(tokens, hidden, layers, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    ws = [[(torch.randn(hidden, hidden, generator=g) * 0.02).to(dtype) for _ in range(3)] for _ in range(layers)]
    bs = [[torch.randn(hidden, generator=g).to(dtype) for _ in range(3)] for _ in range(layers)]
    shared = [(torch.cat(w), torch.cat(b)) for w, b in zip(ws, bs)]
    lin = fastbert.ops.linear

    def one_shared():
        for w, b in shared:
            lin(x, w, b)

    def cat_per_call():
        for w, b in zip(ws, bs):
            lin(x, torch.cat(w), torch.cat(b))

    def three():
        for w, b in zip(ws, bs):
            for wi, bi in zip(w, b):
                lin(x, wi, bi)

    return {"shared tensor": one_shared, "cat per call": cat_per_call, "three GEMMs": three}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    header(command_line(argv))
    print(f"{'tokens':>7}{'hidden':>7}{'layers':>7}{'dtype':>10}{'shared ms':>12}{'cat/call':>12}{'three GEMMs':>13}")
    dtypes = without_slow_bf16([torch.float32, torch.bfloat16])
    for tokens, hidden, layers in CASES:
        for dtype in dtypes:
            with torch.no_grad():
                times = interleaved_cpu_times(providers(tokens, hidden, layers, dtype), warmup=2, repeats=args.rounds)
            med = {k: statistics.median(v) for k, v in times.items()}
            base = med["shared tensor"]
            print(f"{tokens:>7}{hidden:>7}{layers:>7}{str(dtype)[6:]:>10}{base * 1e3:>12.3f}"
                  f"{med['cat per call'] / base:>11.2f}x{med['three GEMMs'] / base:>12.2f}x")
    print("cat/call and three GEMMs: their time over the shared tensor's, measured in this run")


if __name__ == "__main__":
    main()
