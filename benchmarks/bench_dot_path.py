"""What fastbert's own fp32 GEMM (the "dot" path of fastbert.ops.gemm) does to the whole encoder:
BERT-base (random weights, 12 layers) timed with the dot path among the measured candidates and
without it, in one process, the two forms in alternating rounds (medians).

    python benchmarks/bench_dot_path.py [--workloads one20,1x64,1x160,var128] [--rounds 6]

Workloads: the encoder benchmark's (var128, full128, var512, one20) or BxN (B sequences of N tokens).
Each form's GEMM choices are measured once (fastbert.ops.gemm) and kept for its rounds; the
products for which the dot path was chosen are listed as (token bucket, in, out).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import fastbert.hf
from fastbert.bench.report import header
from fastbert.bench.workloads import WORKLOADS, make_batch, random_transformers_encoder
from fastbert.ops import gemm, gemm_paths


def batch(name: str):
    if name in WORKLOADS:
        spec = WORKLOADS[name]
        return make_batch(spec["batch"], spec["lo"], spec["hi"], torch.Generator().manual_seed(0))
    b, n = (int(v) for v in name.split("x"))
    return make_batch(b, n, n, torch.Generator().manual_seed(0))


def choices(model, ids, mask, offered) -> dict:
    """The GEMM choice table measured with `offered` as the paths' offer (then restored)."""
    real = gemm_paths.offered
    gemm_paths.offered = offered
    try:
        gemm.reset()
        model(ids, mask)
        return gemm.choices()
    finally:
        gemm_paths.offered = real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="one20,1x64,1x160,var128")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    header(" ".join(["python", "benchmarks/bench_dot_path.py", *(sys.argv[1:] if argv is None else argv)]))
    model = fastbert.hf.from_transformers(random_transformers_encoder(12)).eval()
    real = gemm_paths.offered

    def without_dot(path, role, dtype):
        return path != "dot" and real(path, role, dtype)

    print(f"{'workload':<10}{'with dot ms':>12}{'without ms':>12}{'speed-up':>10}  products on the dot path")
    with torch.no_grad():
        for name in args.workloads.split(","):
            ids, mask = batch(name)
            tables = {"with": choices(model, ids, mask, real), "without": choices(model, ids, mask, without_dot)}
            times = {k: [] for k in tables}
            for _ in range(args.rounds):
                for k, table in tables.items():
                    gemm.set_choices(table)
                    t0 = time.perf_counter()
                    model(ids, mask)
                    times[k].append(time.perf_counter() - t0)
            w, wo = statistics.median(times["with"]), statistics.median(times["without"])
            dot = sorted({k[1:4] for k, (path, _) in tables["with"].items() if path == "dot"})
            print(f"{name:<10}{w * 1e3:>12.1f}{wo * 1e3:>12.1f}{wo / w:>9.2f}x  {dot}", flush=True)
    gemm.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
