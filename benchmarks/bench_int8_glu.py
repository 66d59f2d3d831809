"""int8's gated feed-forward after its input product: fastbert.ops.int8_glu (the accumulator
dequantized, act(gate) * up and its quantization in one pass) against the composed ops it replaced
(int8_dequantize into a float [rows, 2n] tensor, geglu / swiglu into [rows, n], quantize_rows), in
fp32 and in bf16 (the float dtype of the composed path's tensors; int8_glu works in fp32 either way).
The accumulator is a real one: rows of a [rows x 768] batch quantized per row, times a [2n x 768]
weight quantized per channel, n = 3072 (GTE's, NomicBERT's, EuroBERT-210m's). Every provider is
called in turn, round after round (fastbert.bench.timing.interleaved_cpu_times); medians, and the
ratio of the composed path's to int8_glu's, measured in the same run on the same accumulator. The
two agree within one quantization step (checked before the timing).

    python benchmarks/bench_int8_glu.py [--rows 32,2104,2360] [--gate none|tanh|silu] [--rounds 9] [--json PATH]
"""
from __future__ import annotations

import statistics

import torch

import fastbert
from fastbert import layouts
from fastbert.bench.report import add_output_options, finish, parser
from fastbert.bench.timing import interleaved_cpu_times
from fastbert.reference import int8 as ref


def accumulator(rows: int, k: int, n: int, g: torch.Generator) -> tuple:
    """(acc [rows + 1, 2n] int32, row scales, row offsets, column scales, bias) of a real int8 layer."""
    x = torch.randn(rows, k, generator=g) + 0.5 * torch.randn(k, generator=g)
    xq, xs, xo = ref.quantize_rows(x)
    wq, ws = layouts.quantize_weight(torch.randn(2 * n, k, generator=g) * 0.05)
    return ref.int8_mm(xq, wq), xs, xo, ws, torch.randn(2 * n, generator=g) * 0.1


def composed(args: tuple, gate: str, dtype: torch.dtype):
    h = fastbert.ops.int8_dequantize(*args, dtype=dtype)
    return fastbert.ops.quantize_rows(fastbert.ops.swiglu(h) if gate == "silu" else fastbert.ops.geglu(h, gate))


def measure(rows: int, gate: str, rounds: int, g: torch.Generator, k: int = 768, n: int = 3072) -> dict:
    args = accumulator(rows, k, n, g)
    fused = fastbert.ops.int8_glu(*args, gate)
    q, s, o = composed(args, gate, torch.float32)
    if (fused[0].int() - q.int()).abs().max() > 1:
        raise RuntimeError(f"int8_glu and the composed ops disagree by more than one step at {rows} rows")
    fns = {"composed fp32": lambda: composed(args, gate, torch.float32),
           "composed bf16": lambda: composed(args, gate, torch.bfloat16),
           "int8_glu": lambda: fastbert.ops.int8_glu(*args, gate)}
    ms = {name: statistics.median(t) * 1e3 for name, t in interleaved_cpu_times(fns, repeats=rounds).items()}
    return {"rows": rows, "n": n, "gate": gate, "ms": ms,
            "speedup": {name: ms[name] / ms["int8_glu"] for name in ms if name != "int8_glu"}}


def print_rows(rows) -> None:
    print(f"fastbert kernel level {fastbert.backend.cpu_capability()}, {torch.get_num_threads()} threads")
    print("| rows | [2 x n] | gate | composed fp32 ms | composed bf16 ms | int8_glu ms | vs fp32 / bf16 |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        ms, vs = r["ms"], r["speedup"]
        print(f"| {r['rows']} | [2 x {r['n']}] | {r['gate']} | {ms['composed fp32']:.2f} | {ms['composed bf16']:.2f} | "
              f"{ms['int8_glu']:.2f} | {vs['composed fp32']:.2f}x / {vs['composed bf16']:.2f}x |")


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--rows", default="32,2104,2360", help="comma-separated row counts (tokens)")
    ap.add_argument("--gate", default="none", choices=["none", "tanh", "silu"])
    ap.add_argument("--rounds", type=int, default=9)
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    rows = [measure(int(m), args.gate, args.rounds, g) for m in args.rows.split(",")]
    finish(rows, print_rows, argv, json_path=args.json)


if __name__ == "__main__":
    main()
