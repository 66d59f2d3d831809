"""Benchmark fused attention with a padding mask against PyTorch, counting real tokens only.

On CUDA: TFLOP/s of the "triton" backend, forward and forward+backward, against
torch.nn.functional.scaled_dot_product_attention (flash and math back ends; flash takes no mask,
so it runs over the padded batch as if every token were real: the speed a padding-blind kernel
would reach) and PyTorch eager, at BERT shapes (batch 32, heads 12, head dim 64, seq 128 and 512,
padding 0%, 40%, 70%), with the roofline floor of an H100 (800 TFLOP/s dense fp16, 3.0 TB/s).
On the CPU: the "cpp" backend (padded batch, and packed through varlen_attention) against SDPA
with a padding mask over the padded batch and eager, on a batch of 32 sequences with lengths
uniform in 16..128 (seq 128, 12 heads, head dim 64).

The providers are called in turn, round after round (fastbert.bench.timing), and every ratio is of
medians measured in this run on the same inputs. FLOPs count real tokens only:
forward 4 * sum(len_b^2) * heads * head_dim, backward 2.5x that.

    python benchmarks/bench_attention.py [--dtype float32] [--json PATH] [--png PATH]
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import fastbert
from fastbert import reference
from fastbert.bench import report
from fastbert.bench.tables import print_timings
from fastbert.bench.timing import median_s
from fastbert.dtypes import parse_dtype
from fastbert.plotting import pyplot

PEAK_FLOPS = 800e12  # H100 SXM dense fp16/bf16 tensor-core, rounded
HBM_BYTES_PER_S = 3.0e12


def lengths_for(batch, seq, padding, g):
    """Sequence lengths whose mean padding fraction is about `padding`."""
    if padding == 0:
        return torch.full((batch,), seq, dtype=torch.int64)
    u = torch.rand(batch, generator=g)
    return (seq * (1 - padding) * (0.5 + u)).round().clamp(1, seq).to(torch.int64)


def make_batch(batch, heads, seq, head_dim, lengths, dtype, device, g):
    q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=g).to(device, dtype) for _ in range(3))
    mask = torch.arange(seq)[None, :] < lengths[:, None]
    return q, k, v, mask.to(device)


def flops(lengths, heads, head_dim, direction):
    fwd = 4 * int((lengths.double() ** 2).sum().item()) * heads * head_dim
    return fwd if direction == "fwd" else fwd * 3.5  # fwd + bwd


def providers_for(device, q, k, v, mask):
    """{name: (callable taking (q, k, v), inputs)}: what each provider computes on this batch."""
    out = {}
    allowed = mask[:, None, None, :]
    if device == "cuda":
        out["triton"] = lambda q_, k_, v_: fastbert.ops.attention(q_, k_, v_, mask, backend="triton")

        def flash(q_, k_, v_):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q_, k_, v_)  # no mask: the whole padded batch

        def math_(q_, k_, v_):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=allowed)

        out["sdpa flash (no mask)"] = flash
        out["sdpa math"] = math_
    else:
        out["cpp"] = lambda q_, k_, v_: fastbert.ops.attention(q_, k_, v_, mask, backend="cpp")
        packed_mask = mask

        def cpp_varlen(q_, k_, v_):
            # what the unpadded model path pays: the packed tokens in, packed out
            return fastbert.ops.varlen_attention(q_, k_, v_, cu_seqlens, max_seqlen, backend="cpp")

        _, indices, cu_seqlens, max_seqlen = fastbert.ops.unpad(packed_mask[..., None], packed_mask)
        out["cpp varlen"] = cpp_varlen
        out["sdpa"] = lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, attn_mask=allowed)
    out["eager"] = lambda q_, k_, v_: reference.attention(q_, k_, v_, mask)
    return out


def pack(t, mask):
    return fastbert.ops.unpad(t.transpose(1, 2), mask)[0]


def time_case(device, q, k, v, mask, budget_s, with_backward):
    provs = providers_for(device, q, k, v, mask)
    inputs = {}
    for name in provs:
        ins = [pack(t, mask) for t in (q, k, v)] if name == "cpp varlen" else [q, k, v]
        inputs[name] = [t.detach().clone().requires_grad_(with_backward) for t in ins]
    forward = {n: (lambda f=f, a=inputs[n]: f(*a)) for n, f in provs.items()}
    with torch.no_grad():
        fwd = median_s(forward, device=device, budget_s=budget_s)
    both = None
    if with_backward:
        def step(f, a):
            out = f(*a)
            torch.autograd.grad(out, a, torch.ones_like(out))

        both = median_s({n: (lambda f=f, a=inputs[n]: step(f, a)) for n, f in provs.items()},
                        device=device, budget_s=budget_s)
    return provs, fwd, both


def run(device, dtype, budget_s, cases, with_backward, progress=True):
    rows = []
    for batch, heads, seq, head_dim, _padding, lengths in report.progress_bar(
            cases, desc="bench_attention", disable=not progress):
        g = torch.Generator().manual_seed(seq)
        q, k, v, mask = make_batch(batch, heads, seq, head_dim, lengths, dtype, device, g)
        provs, fwd, both = time_case(device, q, k, v, mask, budget_s, with_backward)
        base = "sdpa" if device != "cuda" else "sdpa math"
        fused = "cpp" if device != "cuda" else "triton"
        es = torch.empty((), dtype=dtype).element_size()
        tokens = int(lengths.sum())
        for direction, times in (("fwd", fwd), ("fwd+bwd", both)):
            if times is None:
                continue
            fl = flops(lengths, heads, head_dim, direction)
            row = {
                "direction": direction, "batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim,
                "padding": round(1 - tokens / (batch * seq), 3), "dtype": str(dtype).replace("torch.", ""),
                "real_tokens": tokens, "flops": fl,
                "ms": {n: t * 1e3 for n, t in times.items()},
                "TFLOP/s": {n: fl / t / 1e12 for n, t in times.items()},
                "speedup": times[base] / times[fused], "baseline": base, "fused": fused,
            }
            if device == "cuda":
                nbytes = (4 if direction == "fwd" else 10) * tokens * heads * head_dim * es
                row["roofline_ms"] = max(fl / PEAK_FLOPS, nbytes / HBM_BYTES_PER_S) * 1e3
            rows.append(row)
    return rows


def print_table(rows, out=sys.stdout):
    keys = [("dir", 8, lambda r: r["direction"]), ("seq", 5, lambda r: str(r["seq"])),
            ("pad", 6, lambda r: f"{r['padding']:.0%}"), ("dtype", 10, lambda r: r["dtype"])]
    r = rows[0]
    print_timings(rows, keys, list(r["ms"]), r["fused"], "TFLOP/s", 16, out)
    print(f"speedup = {r['baseline']} time / {r['fused']} time, measured in this run on the same inputs; "
          "TFLOP/s count real tokens only", file=out)


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    names = list(rows[0]["ms"])
    labels = [f"{r['direction']} s{r['seq']} pad {r['padding']:.0%}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(7, len(rows) * 1.2), 4.5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([x + i * width for x in range(len(rows))], [r["TFLOP/s"][n] for r in rows], width, label=n)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (real tokens)")
    ax.set_title(f"fastbert attention, {rows[0]['dtype']}")
    ax.legend(fontsize=8)
    report.save_figure(fig, path)


def main(argv=None):
    ap = report.parser(__doc__)
    report.add_device_options(ap, budget=5.0)
    ap.add_argument("--dtype", default=None,
                    help="float32, float16 or bfloat16 (default: float16 on CUDA, float32 on the CPU)")
    ap.add_argument("--no-backward", action="store_true", help="time the forward only")
    report.add_output_options(ap, png_help="draw TFLOP/s per provider here")
    args = ap.parse_args(argv)
    try:
        dtype = parse_dtype(args.dtype or ("float16" if args.device == "cuda" else "float32"))
    except ValueError as e:
        ap.error(str(e).removeprefix("fastbert: "))
    g = torch.Generator().manual_seed(0)
    if args.device == "cuda":
        cases = [(32, 12, s, 64, p, lengths_for(32, s, p, g)) for s in (128, 512) for p in (0.0, 0.4, 0.7)]
    else:
        cases = [(32, 12, 128, 64, None, torch.randint(16, 129, (32,), generator=g))]
    rows = run(args.device, dtype, args.budget, cases, not args.no_backward)
    report.finish(rows, print_table, argv, json_path=args.json, png_path=args.png, plot=plot)


if __name__ == "__main__":
    main()
