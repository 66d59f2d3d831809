"""Benchmark the fused ops (bias_gelu, geglu, swiglu, add_layer_norm), forward and backward, against PyTorch.

On CUDA: triton.testing.do_bench GB/s of the "triton" backend against PyTorch eager and
torch.compile of the same math, with the roofline floor from the bytes each op must move at
3.0 TB/s (H100 HBM3). On the CPU: the "cpp" backend against the "torch" backend (plain eager), at
BERT-base and BERT-large shapes; the providers are called in turn, round after round, and the
ratio is of their medians, measured in the same run on the same inputs. The CPU's floor is the
bytes each op must move at the memory bandwidth measured at the start of the run (the best copy of
256 MiB, fastbert.bench.timing.memory_bandwidth), printed with it.

    python benchmarks/bench_ops.py [--dtypes float32,bfloat16] [--json PATH] [--png PATH]

On the CPU, eager torch's times depend on glibc's heap (whether its 4 MiB+ temporaries are mapped
and faulted in afresh on each call). For torch's best case, run with
MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 in the environment.
"""
from __future__ import annotations

import sys

import torch

import fastbert
from fastbert import reference
from fastbert.bench import report
from fastbert.bench.tables import print_timings
from fastbert.bench.timing import median_s, memory_bandwidth
from fastbert.dtypes import parse_dtype
from fastbert.plotting import pyplot

SHAPES = [(4096, 768), (4096, 3072), (4096, 1024)]  # tokens x hidden: BERT-base, its FFN, BERT-large
HBM_BYTES_PER_S = 3.0e12  # H100 SXM
OPS = ("bias_gelu", "geglu", "swiglu", "add_layer_norm")


def bytes_moved(op: str, direction: str, m: int, n: int, es: int) -> int:
    """Bytes the op must read and write at the least (per-feature vectors are negligible)."""
    tensors = {
        ("bias_gelu", "fwd"): 2,  # read x, write y
        ("bias_gelu", "bwd"): 3,  # read dy, x; write dx
        ("geglu", "fwd"): 3,  # read x [m, 2n]; write y [m, n]
        ("geglu", "bwd"): 5,  # read dy [m, n], x [m, 2n]; write dx [m, 2n]
        ("swiglu", "fwd"): 3,  # as geglu's
        ("swiglu", "bwd"): 5,
        ("add_layer_norm", "fwd"): 3,  # read x, residual; write y
        ("add_layer_norm", "bwd"): 5,  # read dy, x, residual; write dx, dresidual
    }[(op, direction)]
    return tensors * m * n * es


def make_case(op: str, m: int, n: int, dtype, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, n, generator=g).to(device, dtype).requires_grad_(True)
    dy = torch.randn(m, n, generator=g).to(device, dtype)
    if op == "bias_gelu":
        b = torch.randn(n, generator=g).to(device, dtype).requires_grad_(True)
        inputs = [x, b]
        eager = lambda x_, b_: reference.bias_gelu(x_, b_)  # noqa: E731
        fused = lambda backend: (lambda x_, b_: fastbert.ops.bias_gelu(x_, b_, backend=backend))  # noqa: E731
    elif op in ("geglu", "swiglu"):  # n: the output's width (the intermediate size); x is [m, 2n]
        inputs = [torch.randn(m, 2 * n, generator=g).to(device, dtype).requires_grad_(True)]
        eager = getattr(reference, op)
        fused = lambda backend: (lambda x_: getattr(fastbert.ops, op)(x_, backend=backend))  # noqa: E731
    else:
        res = torch.randn(m, n, generator=g).to(device, dtype).requires_grad_(True)
        w = torch.randn(n, generator=g).to(device, dtype).requires_grad_(True)
        b = torch.randn(n, generator=g).to(device, dtype).requires_grad_(True)
        inputs = [x, res, w, b]
        eager = lambda *a: reference.add_layer_norm(*a)  # noqa: E731
        fused = lambda backend: (lambda *a: fastbert.ops.add_layer_norm(*a, backend=backend))  # noqa: E731
    return inputs, dy, eager, fused


def time_fwd_bwd(fns, inputs, dy, device, budget_s):
    """{provider: (forward seconds, backward seconds)}, the providers timed in turn (see timing)."""
    with torch.no_grad():
        fwd = median_s({name: (lambda f=fn: f(*inputs)) for name, fn in fns.items()}, device=device, budget_s=budget_s)
    outs = {name: fn(*inputs) for name, fn in fns.items()}
    bwd = median_s(
        {name: (lambda y=y: torch.autograd.grad(y, inputs, dy, retain_graph=True)) for name, y in outs.items()},
        device=device, budget_s=budget_s,
    )
    return {name: (fwd[name], bwd[name]) for name in fns}


def run(dtypes, device, shapes=SHAPES, budget_s=3.0, progress=True):
    if device == "cuda":
        providers = {"fused": "triton", "baseline": "torch eager", "compiled": "torch.compile"}
    else:
        providers = {"fused": "cpp", "baseline": "torch"}
    floor_bytes_per_s = HBM_BYTES_PER_S if device == "cuda" else memory_bandwidth() * 1e9
    if device != "cuda":
        print(f"memory bandwidth of this machine: {floor_bytes_per_s / 1e9:.1f} GB/s (the best copy of 256 MiB, "
              "read + write); floor ms = the bytes an op must move at that rate")
    cases = [(op, m, n, dt) for dt in dtypes for op in OPS for (m, n) in shapes]
    rows = []
    for op, m, n, dtype in report.progress_bar(cases, desc="bench_ops", disable=not progress):
        inputs, dy, eager, fused = make_case(op, m, n, dtype, device)
        fns = {providers["fused"]: fused(providers["fused"]), providers["baseline"]: eager}
        if "compiled" in providers:
            # the backward is timed by replaying one graph (retain_graph), which donated buffers forbid
            import torch._functorch.config as functorch_config

            functorch_config.donated_buffer = False
            fns[providers["compiled"]] = torch.compile(eager)
        times = time_fwd_bwd(fns, inputs, dy, device, budget_s)
        es = torch.empty((), dtype=dtype).element_size()
        for d, direction in enumerate(("fwd", "bwd")):
            nbytes = bytes_moved(op, direction, m, n, es)
            row = {
                "op": op, "direction": direction, "shape": [m, n], "dtype": str(dtype).replace("torch.", ""),
                "bytes": nbytes,
                "ms": {k: v[d] * 1e3 for k, v in times.items()},
                "GB/s": {k: nbytes / v[d] / 1e9 for k, v in times.items()},
                "speedup": times[providers["baseline"]][d] / times[providers["fused"]][d],
            }
            row["roofline_ms"] = nbytes / floor_bytes_per_s * 1e3
            rows.append(row)
    return providers, rows


def print_table(providers, rows, out=sys.stdout):
    fused, base = providers["fused"], providers["baseline"]
    names = [fused, base] + ([providers["compiled"]] if "compiled" in providers else [])
    keys = [("op", 15, lambda r: r["op"]), ("dir", 5, lambda r: r["direction"]),
            ("shape", 12, lambda r: "x".join(map(str, r["shape"]))), ("dtype", 10, lambda r: r["dtype"])]
    print_timings(rows, keys, names, fused, "GB/s", 18, out)
    print(f"speedup = {base} time / {fused} time, both measured in this run on the same inputs", file=out)


def plot(rows, providers, path):
    plt = pyplot()
    if plt is None:
        return
    labels = [f"{r['op']} {r['direction']}\n{'x'.join(map(str, r['shape']))} {r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.7), 4.5))
    ax.bar(range(len(rows)), [r["speedup"] for r in rows], color="tab:blue")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=7, ha="right")
    ax.set_ylabel(f"speedup of {providers['fused']} over {providers['baseline']}")
    ax.set_title("fastbert fused ops")
    report.save_figure(fig, path)


def main(argv=None):
    ap = report.parser(__doc__)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32,float16,bfloat16")
    report.add_device_options(ap, budget=3.0)
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES),
                    help="tokens x hidden, comma-separated")
    report.add_output_options(ap, png_help="draw the speedups here")
    args = ap.parse_args(argv)
    try:
        dtypes = [parse_dtype(d) for d in args.dtypes.split(",")]
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    except ValueError as e:
        ap.error(str(e).removeprefix("fastbert: "))
    if args.device == "cpu":
        dtypes = report.without_slow_bf16(dtypes)
    providers, rows = run(dtypes, args.device, shapes=shapes, budget_s=args.budget)
    report.finish(rows, lambda r: print_table(providers, r), argv, json_path=args.json, png_path=args.png,
                  plot=lambda r, path: plot(r, providers, path), providers=providers)


if __name__ == "__main__":
    main()
