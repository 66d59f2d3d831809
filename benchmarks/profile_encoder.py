"""Where one forward of fastbert's BERT-base goes: wall-clock timers around every fastbert.ops call the
model makes (and around the GEMM kernel inside each linear layer), on one workload of the encoder
benchmark, after warm-up.

    python benchmarks/profile_encoder.py [--workload one20] [--quantize int8] [--layers 12] [--rounds 20]
        [--threads N] [--clock wall|cpu] [--torch-profiler] [--python-layer]

Timers rather than torch.profiler by default: on a 2-core machine the profiler's per-thread
bookkeeping inflates every parallel region (a short kernel's most: it shows as many times its own
time inside the model), so its table says more about the profiler than about the model;
--torch-profiler prints it as well.
Each line: milliseconds a forward, calls a forward, microseconds a call; "model code outside the
ops" is the forward's time less the ops' (input checks, masks, the layer loop, views and
allocation in Python). The first call (the GEMM paths measured for each new shape) is reported apart.
--clock cpu times with the process's CPU time instead of the wall clock: with --threads 1 that is
the work itself, unmoved by other processes on a shared machine (with more threads it would count
the pool's threads spinning while they wait).
Once every GEMM path of a layer is measured and is one the extension's whole-layer call runs
(csrc/encoder_layer.cpp), all the layers are one C++ call (fastbert.ops.encoder.encoder_stack), on a line of its
own, their GEMMs and kernels within it. --python-layer calls each layer's kernels from Python one by
one instead, each on its own line; --separate-ops runs each layer as the separate ops.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

import torch

import fastbert
import fastbert.hf
from fastbert import ops
from fastbert.bench.report import header
from fastbert.bench.workloads import WORKLOADS, make_batch, random_transformers_encoder
from fastbert.model import bert, layers
from fastbert.ops import encoder, gemm

OPS = ("embedding", "encoder_layer", "linear", "add_layer_norm", "bias_gelu", "attention", "varlen_attention", "unpad", "pad",
       "quantize_rows", "int8_matmul", "int8_dequantize", "int8_bias_gelu", "int8_add_layer_norm")


class Timers:
    """Seconds and calls per label of the wrapped functions (an op called inside another op counts
    for the outer one only), on `clock`."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.seconds = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.depth = 0

    def clear(self):
        self.seconds.clear()
        self.calls.clear()

    def wrap(self, owner, name: str, label: str, nested: bool = False):
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            if self.depth and not nested:
                return fn(*args, **kwargs)
            self.depth += 0 if nested else 1
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += self.clock() - t0
                self.calls[label] += 1
                self.depth -= 0 if nested else 1

        setattr(owner, name, timed)


def instrument(clock) -> Timers:
    timers = Timers(clock)
    for name in OPS:
        timers.wrap(ops, name, name)
    timers.wrap(encoder, "encoder_stack", "every fp32 layer, one C++ call")
    timers.wrap(encoder, "int8_encoder_stack", "every int8 layer, one C++ call")
    timers.wrap(bert, "check_inputs", "input checks")
    timers.wrap(bert, "attention_masks", "attention_masks")
    call = gemm.call

    def gemm_call(path, role, a, b, bias, alloc):
        t0 = clock()
        try:
            return call(path, role, a, b, bias, alloc)
        finally:
            label = f"  GEMM kernel: {path}"
            timers.seconds[label] += clock() - t0
            timers.calls[label] += 1

    gemm.call = gemm_call
    return timers


def report(timers: Timers, total: float, rounds: int) -> None:
    ops_s = sum(v for k, v in timers.seconds.items() if not k.startswith(" ")) / rounds
    rows = sorted(timers.seconds.items(), key=lambda kv: -kv[1])
    print(f"{'item':<36}{'ms/forward':>11}{'calls':>7}{'us/call':>10}{'share':>8}")
    for k, v in rows:
        n = timers.calls[k] // rounds
        print(f"{k:<36}{v / rounds * 1e3:>11.2f}{n:>7}{v / timers.calls[k] * 1e6:>10.1f}{v / rounds / total:>7.0%}")
    print(f"{'model code outside the ops':<36}{(total - ops_s) * 1e3:>11.2f}{'':>17}{(total - ops_s) / total:>7.0%}")
    print(f"{'forward (mean of the timed rounds)':<36}{total * 1e3:>11.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="one20", choices=sorted(WORKLOADS))
    ap.add_argument("--quantize", default=None, choices=["int8"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="wall clock, or the process's CPU time (meaningful with --threads 1)")
    ap.add_argument("--torch-profiler", action="store_true", help="also print torch.profiler's table")
    ap.add_argument("--separate-ops", action="store_true", help="run each layer as separate op calls")
    ap.add_argument("--python-layer", action="store_true",
                    help="call each layer's kernels one by one from Python instead of the whole layer in one C++ call")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.separate_ops:
        layers.BertLayer._one_call = lambda self: False
        encoder.encoder_stack = lambda *args, **kwargs: None
    if args.python_layer:  # no GEMM path is one the C++ layer runs: each layer falls back to Python
        encoder.FLOAT_LAYER_PATHS = {}
        encoder.INT8_LAYER_PATHS = {}
    header(" ".join(["python", "benchmarks/profile_encoder.py", *(sys.argv[1:] if argv is None else argv)]))
    model = fastbert.hf.from_transformers(random_transformers_encoder(args.layers)).eval()
    if args.quantize:
        model.quantize_(args.quantize)
    spec = WORKLOADS[args.workload]
    ids, mask = make_batch(spec["batch"], spec["lo"], spec["hi"], torch.Generator().manual_seed(0))
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    timers = instrument(clock)
    with torch.no_grad():
        t0 = time.perf_counter()
        model(ids, mask)
        first = time.perf_counter() - t0
        for _ in range(3):
            model(ids, mask)
        timers.clear()
        times = []
        for _ in range(args.rounds):
            t0 = clock()
            model(ids, mask)
            times.append(clock() - t0)
    q = statistics.quantiles(times, n=4)
    print(f"{args.workload} ({spec['batch']} x {spec['lo']}..{spec['hi']} tokens), fastbert "
          f"{args.quantize or 'fp32'}, {args.layers} layers, {torch.get_num_threads()} threads, {args.clock} clock: first call "
          f"{first * 1e3:.0f} ms; then median {statistics.median(times) * 1e3:.1f} ms (quartiles "
          f"{q[0] * 1e3:.1f} / {q[2] * 1e3:.1f}) over {args.rounds} calls")
    report(timers, sum(times) / len(times), args.rounds)
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.rounds):
                model(ids, mask)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))
    return 0


if __name__ == "__main__":
    sys.exit(main())
