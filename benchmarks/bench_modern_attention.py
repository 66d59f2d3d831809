"""Benchmark the attention of ModernBERT's layers on the CPU: global (rotary base 160,000, every key)
and local (rotary base 10,000, a window of 64 keys on either side), fastbert's fused "cpp" kernel
(packed sequences, rotary applied as q and k are read, the blocks past the window never computed)
against what transformers' ModernBERT runs with attn_implementation="sdpa": q and k rotated in
memory, then torch.nn.functional.scaled_dot_product_attention over the padded batch with the
padding mask (and, local layers, the sliding-window band in the same mask).

Shapes: ModernBERT-base's 12 heads of 64; one sequence of 2048 tokens, and a batch of 8 with
lengths uniform in 128..512 (padded to the longest). Forward, and forward + backward (the gradients
of q, k and v). The providers are called in turn, round after round, on the same inputs; every
ratio is of medians measured in this run. "local / global" is the fused kernel's local-layer time
over its global-layer time on the same batch: at 2048 tokens the local layer should cost at most a
third of the global one (its keys per query: 129 of 2048). "GFLOP/s" is the fused kernel's rate on
the products it must compute (4 * head_dim FLOPs per query-key pair and head in the forward: q.k
and the weight times v; 2.5 times that again in the backward: the scores recomputed, dP, dV, dK
and dQ), beside the machine's best fp32 GEMM rate measured at the start of the run
(fastbert.bench.timing.fp32_gemm_rate): attention's products are small and interleaved with the
softmax, so this share says how far the kernel is from the machine's arithmetic floor.

    python benchmarks/bench_modern_attention.py [--dtype float32] [--json PATH]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fastbert
from fastbert import reference
from fastbert.bench import report
from fastbert.bench.timing import attention_pairs, fp32_gemm_rate, median_s
from fastbert.dtypes import parse_dtype

HEADS, HEAD_DIM, WINDOW = 12, 64, 64
LAYERS = {"global": (160000.0, None), "local": (10000.0, WINDOW)}  # rotary base, window


def batches(g):
    """(name, lengths) of the measured batches."""
    return [("1 x 2048", torch.tensor([2048])), ("8 x 128..512", torch.randint(128, 513, (8,), generator=g))]


def pair_flops(lengths, window, backward: bool) -> float:
    """FLOPs of the products over the query-key pairs the layer must compute (see the docstring)."""
    return 4 * HEAD_DIM * HEADS * attention_pairs(lengths, window) * (3.5 if backward else 1.0)


def providers(lengths, dtype, g):
    """{(layer, provider): (fn, inputs)} for one batch: the fused kernel on the packed tokens, SDPA
    on the padded batch as transformers runs it."""
    seq, batch = int(lengths.max()), len(lengths)
    mask = torch.arange(seq)[None, :] < lengths[:, None]
    cu = torch.tensor([0] + lengths.cumsum(0).tolist(), dtype=torch.int32)
    packed = [torch.randn(int(lengths.sum()), HEADS, HEAD_DIM, generator=g).to(dtype) for _ in range(3)]
    padded = [fastbert.ops.pad(t, fastbert.ops.unpad(mask[..., None], mask)[1], batch, seq).transpose(1, 2).contiguous()
              for t in packed]
    out = {}
    for layer, (base, window) in LAYERS.items():
        cos, sin = reference.rotary_tables(base, HEAD_DIM, seq)
        allowed = mask[:, None, None, :] | ~mask[:, None, :, None]
        if window is not None:
            allowed = allowed & reference.window_band(seq, window)

        def fused(q, k, v, base=base, window=window):
            return fastbert.ops.varlen_attention(q, k, v, cu, seq, backend="cpp", rotary_base=base, window=window)

        def sdpa(q, k, v, cos=cos, sin=sin, allowed=allowed):
            q, k = reference.rotate(q, cos, sin), reference.rotate(k, cos, sin)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

        out[layer, "fastbert cpp"] = (fused, packed)
        out[layer, "transformers sdpa"] = (sdpa, padded)
    return out


def measure(provs, budget_s, backward):
    leaves = {n: [t.detach().clone().requires_grad_(backward) for t in ins] for n, (_, ins) in provs.items()}

    def call(fn, args):
        out = fn(*args)
        if backward:
            torch.autograd.grad(out, args, torch.ones_like(out))

    fns = {n: (lambda f=f, a=leaves[n]: call(f, a)) for n, (f, _) in provs.items()}
    if backward:
        return median_s(fns, budget_s=budget_s)
    with torch.no_grad():
        return median_s(fns, budget_s=budget_s)


def main(argv=None):
    ap = report.parser(__doc__)
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per batch and direction (at least 5 rounds)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dtype = parse_dtype(args.dtype)
    info = report.header(report.command_line(argv, "python benchmarks/bench_modern_attention.py"
                                             if argv is not None else None))
    g = torch.Generator().manual_seed(0)
    rows = []
    gemm = fp32_gemm_rate()
    print(f"best fp32 GEMM rate of this machine: {gemm['gflops']:.0f} GFLOP/s ({gemm['by']}, {gemm['shape']})")
    print(f"{'batch':<14}{'direction':<10}{'layer':<8}{'fastbert ms':>12}{'sdpa ms':>10}{'speedup':>9}"
          f"{'local / global':>16}{'GFLOP/s':>9}{'of GEMM':>9}")
    for name, lengths in batches(g):
        provs = providers(lengths, dtype, g)
        for direction, backward in (("fwd", False), ("fwd+bwd", True)):
            t = measure(provs, args.budget, backward)
            for layer in LAYERS:
                ours, theirs = t[layer, "fastbert cpp"] * 1e3, t[layer, "transformers sdpa"] * 1e3
                share = ours / (t["global", "fastbert cpp"] * 1e3)
                rate = pair_flops(lengths, LAYERS[layer][1], backward) / ours / 1e6
                rows.append(dict(batch=name, direction=direction, layer=layer, dtype=args.dtype, fastbert_ms=ours,
                                 sdpa_ms=theirs, speedup=theirs / ours, local_over_global=share, gflops=rate,
                                 gemm_gflops=gemm["gflops"]))
                print(f"{name:<14}{direction:<10}{layer:<8}{ours:>12.2f}{theirs:>10.2f}{theirs / ours:>8.2f}x"
                      f"{share if layer == 'local' else float('nan'):>16.2f}{rate:>9.0f}{rate / gemm['gflops']:>9.0%}",
                      flush=True)
    if args.json:
        report.write_json(args.json, report.command_line(argv), info, rows)


if __name__ == "__main__":
    main()
