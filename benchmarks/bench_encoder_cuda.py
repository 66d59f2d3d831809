"""Benchmark the whole encoder on CUDA: fastbert BertModel (Triton kernels, packed batches) against
transformers' BertModel (attn_implementation "sdpa") on the same random BERT-base weights and batches.

Workloads: those of the CPU benchmark (fastbert.bench.workloads.WORKLOADS: var128, full128, var512,
one20) with --scale times as many sequences (a GPU needs more than 32 short ones to fill).
Providers in each dtype: fastbert with the model cast to the dtype, transformers cast to it, in
fp16 / bf16 transformers under torch.autocast, and in inference fastbert with CUDA graphs
(model.cuda_graphs(): one replay a forward, captured at its bucket's first batch, before the
timing); with --compiled, transformers under torch.compile(mode="max-autotune") and fastbert under
torch.compile(mode="reduce-overhead"), compiled (and autotuned) at their first call, before the
timing. Two directions: inference (torch.no_grad) and a training step's forward and backward
(the loss: a fixed random weighting of the last hidden state at the real tokens). Timed with
triton.testing.do_bench (medians), the providers in turn on the same inputs. Every row carries the
max abs error at the real tokens against transformers in fp32; the fp32 training row also the
largest gradient error over all parameters, relative to that parameter's largest gradient.

    python benchmarks/bench_encoder_cuda.py [--workloads var128,var512] [--dtypes float32,float16,bfloat16]
        [--layers 12] [--scale 4] [--compiled] [--json PATH]
"""
from __future__ import annotations

import contextlib
import copy
import sys

import torch

import fastbert
from fastbert.bench import report
from fastbert.bench.timing import median_s
from fastbert.bench.workloads import WORKLOADS, make_batch, random_transformers_encoder
from fastbert.dtypes import dtype_name, parse_dtype


def providers(layers: int, dtypes, compiled: bool = False):
    """{name: model called as model(input_ids=..., attention_mask=...)} and the fp32 reference model.
    compiled: also transformers under torch.compile(mode="max-autotune") and fastbert under
    torch.compile(mode="reduce-overhead") (inductor's CUDA graphs over fastbert's kernels)."""
    hf = random_transformers_encoder(layers, "sdpa").cuda()
    fb = fastbert.hf.from_transformers(hf).cuda().eval()
    out = {}
    for dtype in dtypes:
        tag = dtype_name(dtype)
        mine = fb if dtype == torch.float32 else copy.deepcopy(fb).to(dtype)
        out[f"fastbert {tag}"] = (mine, None)
        out[f"fastbert {tag} graphs"] = (copy.deepcopy(mine).cuda_graphs(), None)  # inference only
        theirs = hf if dtype == torch.float32 else copy.deepcopy(hf).to(dtype)
        out[f"transformers {tag}"] = (theirs, None)
        if dtype != torch.float32:
            out[f"transformers {tag} autocast"] = (hf, dtype)
        if compiled:
            out[f"transformers {tag} compiled"] = (torch.compile(theirs, mode="max-autotune"), None)
            out[f"fastbert {tag} compiled"] = (torch.compile(mine, mode="reduce-overhead"), None)
    return out, hf


def call(model, autocast, ids, mask):
    torch.compiler.cudagraph_mark_step_begin()  # for the compiled models' CUDA graphs: each call a step of its own
    with contextlib.nullcontext() if autocast is None else torch.autocast("cuda", dtype=autocast):
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


def train_step(model, autocast, ids, mask, weights):
    """Forward and backward of the loss (last hidden state at the real tokens * weights).sum(): a
    random weighting (a plain mean square would be constant after the final LayerNorm)."""
    model.zero_grad(set_to_none=True)
    y = call(model, autocast, ids, mask)
    loss = (y[mask.bool()].float() * weights).sum()  # real tokens only: padded positions are not defined
    loss.backward()
    return loss


def grad_error(fb, hf, ids, mask, weights) -> float:
    """Largest |grad fastbert - grad transformers| / max |grad transformers| over the parameters (fp32)."""
    train_step(fb, None, ids, mask, weights)  # the two may share parameters: keep fastbert's gradients aside
    ours = {n: p.grad.clone() for n, p in fb.named_parameters() if p.grad is not None}
    train_step(hf, None, ids, mask, weights)
    theirs = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None and n in ours}
    # a floor under each scale: the key bias's gradient is zero in exact arithmetic (softmax ignores
    # a shift shared by every key), so both sides hold rounding noise there
    floor = 1e-4 * max(g.abs().max().item() for g in theirs.values())
    return max(((ours[n] - g).abs().max() / max(g.abs().max().item(), floor)).item() for n, g in theirs.items())


def run_workload(name, layers, dtypes, scale, g, progress=True, compiled=False):
    w = WORKLOADS[name]
    ids, mask = make_batch(w["batch"] * scale, w["lo"], w["hi"], g)
    ids, mask = ids.cuda(), mask.cuda()
    provs, hf = providers(layers, dtypes, compiled)
    real = mask.bool()
    tokens = int(real.sum())
    weights = torch.randn(tokens, hf.config.hidden_size, generator=g).cuda() / tokens ** 0.5
    with torch.no_grad():
        want = call(hf, None, ids, mask)[real].float()
        errors = {n: (call(m, a, ids, mask)[real].float() - want).abs().max().item() for n, (m, a) in provs.items()}
    rows = []
    for direction in ("inference", "training"):
        if direction == "inference":
            fns = {n: (lambda m=m, a=a: torch.no_grad()(call)(m, a, ids, mask)) for n, (m, a) in provs.items()}
        else:
            fns = {n: (lambda m=m, a=a: train_step(m, a, ids, mask, weights)) for n, (m, a) in provs.items()
                   if not n.endswith("graphs")}  # (training runs eagerly: the graphs' row would be fastbert's)
        times = median_s(fns, device="cuda")
        fp32 = provs.get("fastbert fp32")
        gerr = grad_error(fp32[0], hf, ids, mask, weights) if direction == "training" and fp32 else None
        for dtype in dtypes:
            tag = dtype_name(dtype)
            base = times[f"transformers {tag}"]
            best = min(v for k, v in times.items() if k.startswith(f"transformers {tag}"))
            for n, t in times.items():
                if not n.split(" ")[1] == tag:
                    continue
                row = {"workload": name, "sequences": int(ids.shape[0]), "real_tokens": tokens,
                       "padding": round(1 - tokens / ids.numel(), 3), "direction": direction, "dtype": tag,
                       "provider": n, "ms": t * 1e3, "tokens_per_s": tokens / t, "vs_transformers": base / t,
                       "vs_fastest_transformers": best / t, "max_abs_err": errors[n]}
                if gerr is not None and n == "fastbert fp32":
                    row["max_rel_grad_err"] = gerr
                rows.append(row)
        if progress:
            print(f"{name} {direction}: done", file=sys.stderr)
    return rows


def print_rows(rows, out=sys.stdout):
    print("| workload | direction | provider | ms | real tokens/s | vs transformers (cast) | vs fastest transformers "
          "| max abs err |", file=out)
    print("|---|---|---|---:|---:|---:|---:|---:|", file=out)
    for r in rows:
        extra = f" (grads {r['max_rel_grad_err']:.1e} rel)" if "max_rel_grad_err" in r else ""
        print(f"| {r['workload']} ({r['sequences']} seq, {r['padding']:.0%} pad) | {r['direction']} | {r['provider']} "
              f"| {r['ms']:.2f} | {r['tokens_per_s']:,.0f} | {r['vs_transformers']:.2f}x "
              f"| {r['vs_fastest_transformers']:.2f}x | {r['max_abs_err']:.1e}{extra} |", file=out)


def main(argv=None):
    ap = report.parser(__doc__)
    ap.add_argument("--workloads", default="var128,var512")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--scale", type=int, default=4, help="times as many sequences as the CPU workload")
    ap.add_argument("--compiled", action="store_true",
                    help="also torch.compile: transformers with mode='max-autotune', fastbert with 'reduce-overhead' "
                         "(minutes of compiling, autotuning)")
    report.add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("no CUDA device here: this benchmark times the GPU path (bench_encoder.py times the CPU)")
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    dtypes = [parse_dtype(d) for d in args.dtypes.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for both sides
    g = torch.Generator().manual_seed(0)
    rows = [r for w in args.workloads.split(",")
            for r in run_workload(w, args.layers, dtypes, args.scale, g, compiled=args.compiled)]
    report.finish(rows, print_rows, argv, json_path=args.json)


if __name__ == "__main__":
    main()
