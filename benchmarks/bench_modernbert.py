"""ModernBERT-base (or MPNet-base, --model mpnet, or gte-multilingual-base, --model gte) on fastbert
against transformers' own model and, with the peers, the same model exported to ONNX and run by ONNX
Runtime and by OpenVINO, on the CPU, same random weights, same batches, each engine built and timed
alone in a process of its own (--in-process: all in this one).

The model: transformers' ModernBertConfig defaults, which are ModernBERT-base's (22 layers, hidden
768, 12 heads, GeGLU 1152, vocabulary 50,368, a global layer every third with rotary base 160,000,
the others local: a 128-token window, base 10,000), random weights (seeded), eval, fp32; --layers
cuts the depth for a quicker run. transformers runs attn_implementation="sdpa" (its padded path:
q and k rotated in memory, a [seq, seq] mask with the window in it); fastbert runs the cpp backend
(the real tokens packed, rotary and the window inside the attention kernel). --model mpnet:
transformers' MPNetConfig defaults (all-mpnet-base-v2's size: 12 layers, hidden 768, vocabulary
30,527; the relative position bias read by distance inside fastbert's attention kernel), against
transformers' default attention for MPNet (switching its config to "sdpa" after construction
changed its outputs by 0.17 here: the bias was lost); its positions stop at 512 tokens, so one2048
is not run for it. --model gte: transformers' GteConfig defaults (gte-multilingual-base's: 12 layers,
hidden 768, gated feed-forward 3072, vocabulary 250,048, rotary base 160,000), sdpa, against
fastbert's post-LN encoder with the rotation inside the attention kernel and the GeGLU fused;
--model nomic_bert (nomic-embed-text-v1.5's: GTE's layer without biases, SwiGLU, rotary base 1000)
and --model jina_embeddings_v3 (jina-embeddings-v3's: 24 layers, hidden 1024, rotary base 20000, a
plain GELU feed-forward) the same way; --model eurobert (transformers' EuroBertConfig defaults,
EuroBERT-210m's shape: a pre-norm encoder of 12 layers, hidden 768, RMSNorm, SwiGLU 3072, vocabulary
128,256), sdpa, against fastbert's add + RMSNorm fused, Q, K and V one GEMM and so gate and up;
--model deberta-v2 (deberta-v3-base's: 12 layers, hidden 768, relative attention over 256 log
buckets, c2p and p2c with shared projections, vocabulary 128,100), transformers' eager attention
(its only one), against fastbert's layer with the disentangled attention.

The peers (--peers, both by default; the optional extra `pip install -e .[peers]`; a missing one
is skipped with a printed reason): transformers' model is exported once to ONNX, into a temporary
directory removed once the engines have read it, and ONNX Runtime (CPU provider, every graph
optimization of its own; its transformers optimizer, which the BERT benchmark runs, has no
ModernBERT or MPNet model type) and OpenVINO (CPU, f32, the latency hint) both run that one file
as exported, at torch's thread count (fastbert.bench.peers.onnx_peers). Padded batches go to them padded, with
their attention mask, as a deployment would send them. The export (fastbert.bench.peers.export_onnx,
the one the encoder benchmark's ONNX Runtime peer uses): torch.onnx.export with the TorchScript
exporter (dynamo=False) at opset 17, the batch and sequence axes of input_ids and attention_mask
dynamic, transformers' eager attention. The dynamo exporter (dynamo=True) was tried first and
fails here: it needs onnxscript, which the peers extra does not install. The TorchScript export
of transformers 5.24's ModernBERT needs nothing else: its mask builders keep the padding mask and
the sliding window in the graph while tracing (their "no padding: no mask" shortcut is off under
tracing), the rotary angles come from the traced sequence length, and the eager and sdpa exports
give the same outputs (both within 1e-6 of transformers on batches of other shapes than the one
traced). It is traced on a padded batch longer than the window (rows of 160 and 100 tokens).
MPNet's export (--model mpnet) is the same call, its relative position bias in the traced graph.

Workloads (fastbert.bench.workloads): var128 (32 sequences of 16..128 tokens), var512 (8 of
64..512) and one2048 (one sequence of 2048 tokens); one20 (one query of 20 tokens: a server's
single short request) and small (4 of 40..160: a quick check that crosses the 64-token window),
not run unless named. Timing: by default each engine (fastbert's model, transformers', each peer's
on the one exported file) is built in a child process of its own (fastbert.bench.isolated), which
runs every workload once untimed and then --rounds times timed; two passes, the engines in turn, so
that a change in the machine's load reaches all alike. In one process an engine's thread pools slow
the engines timed after it (OpenVINO's slowed fastbert's var512 by 1.5x: benchmarks/LOG.md).
--in-process: interleaved rounds in this process, each calling every engine once on the same batch
(quicker). Medians; every ratio is of times measured in this run. Every engine's last hidden state
is compared with fastbert's at the real tokens (max abs error); a peer beyond rounding noise
(TOLERANCES: fp32 1e-4, against about 1e-6 measured; bf16 0.5) is reported as disagreeing and its
times are left out (in process: not timed), so a speed-up never hides a wrong answer. --dtype bfloat16: transformers'
and fastbert's models in bf16, OpenVINO at its bf16 inference precision on the fp32 export, ONNX
Runtime skipped (its CPU provider runs the graph in fp32). --dtype int8: fastbert's int8 inference
(quantize_("int8")) and ONNX Runtime on the same export through its dynamic quantization (int8
weights, activations quantized per call) and OpenVINO on it through NNCF's post-training
quantization (int8 weights and activations, the activations' scales calibrated on the two random
sequences the export is traced on, the workloads' kind of input), against transformers in fp32 (it
has no int8 of its own). Each engine's error is then taken against transformers' fp32 output,
fastbert's included, and an int8 engine whose least cosine to it over the real tokens is under
INT8_LEAST_COSINE is reported as disagreeing, its times left out.
"vs X" is X's time over fastbert's: fastbert's speed-up over X.

    python benchmarks/bench_modernbert.py [--model modernbert|mpnet|gte|nomic_bert|jina_embeddings_v3|eurobert|deberta-v2]
        [--workloads var128,var512,one2048] [--layers N] [--rounds 5] [--peers onnxruntime,openvino]
        [--dtype float32|bfloat16|int8] [--in-process] [--json PATH]
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile

import torch

from fastbert.bench.isolated import isolated_engine_runs
from fastbert.bench.peers import ONNX_PEERS, export_for, onnx_peers, onnx_skips, print_skipped
from fastbert.bench.report import command_line, header, parser, write_json
from fastbert.bench.timing import encoder_flops, fp32_gemm_rate, interleaved_cpu_times
from fastbert.bench.workloads import MODERN_ARCHS, WORKLOADS, make_batch, modern_models, modern_transformers

MODERN_WORKLOADS = {**{k: WORKLOADS[k] for k in ("var128", "var512", "one20")}, "one2048": dict(batch=1, lo=2048, hi=2048),
                    "small": dict(batch=4, lo=40, hi=160)}
DEFAULT_WORKLOADS = {"modernbert": "var128,var512,one2048", "mpnet": "var128,var512", "gte": "var128,var512",
                     "nomic_bert": "var128,var512", "jina_embeddings_v3": "var128,var512", "eurobert": "var128,var512",
                     "deberta-v2": "var128,var512"}
# max abs error at real tokens that is still rounding noise (values up to about 4): fp32 (1e-6 measured);
# bf16, every engine rounding its own way through 22 layers
TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 0.5}
INT8_LEAST_COSINE = 0.9  # int8 against fp32: each engine quantizes its own way; below this it is broken
WIDTH = 17  # of each engine's columns

def engines(theirs, peers, dtype) -> tuple:
    """({engine: run(ids, mask) -> last hidden state}: transformers', then each peer's on the model
    exported once (from `theirs` in fp32) and run in `dtype`, {peer: why skipped})."""
    runs = {"transformers": lambda i, m: theirs(input_ids=i, attention_mask=m).last_hidden_state}
    if not peers:
        return runs, {}
    peer_runs, skipped = onnx_peers(theirs, *trace_batch(theirs.config), peers, dtype)
    return {**runs, **peer_runs}, skipped


def trace_batch(cfg) -> tuple:
    """(ids, mask) the ONNX export is traced on: padded, longer than ModernBERT's window."""
    ids = torch.randint(1000, cfg.vocab_size, (2, 160), generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(160)[None] < torch.tensor([[160], [100]])).long()
    return ids.masked_fill(mask == 0, cfg.pad_token_id), mask


def measure(name, ours, runs, ids, mask, rounds, dtype) -> dict:
    """One workload's row, every engine in this process: every engine's error (agreement), then the
    medians of interleaved rounds of fastbert and every engine that agrees."""
    real = mask.bool()
    with torch.inference_mode():
        outs = {"fastbert": ours(input_ids=ids, attention_mask=mask).last_hidden_state[real].float()}
        outs.update({k: run(ids, mask)[real].float() for k, run in runs.items()})
        errors, cosine, disagree = agreement(name, outs, dtype, "not timed")
        timed = {"fastbert": lambda: ours(input_ids=ids, attention_mask=mask)}
        timed.update({k: (lambda r=run: r(ids, mask)) for k, run in runs.items() if k not in disagree})
        times = interleaved_cpu_times(timed, warmup=1, repeats=rounds)
    return row_of(name, mask, errors, cosine, disagree, times)


def agreement(name, outs, dtype, dropped: str) -> tuple:
    """({engine: max abs error}, {engine: least cosine}, [engines that disagree]) of outs ({engine: last
    hidden state at the real tokens}) against fastbert's (int8: against transformers' fp32 output,
    fastbert's too); each one that disagrees is said, with what is done with its times (`dropped`)."""
    want = outs["transformers" if dtype == torch.int8 else "fastbert"]
    errors = {k: (v - want).abs().max().item() for k, v in outs.items() if v is not want}
    cosine = {k: torch.nn.functional.cosine_similarity(v, want, dim=-1).min().item()
              for k, v in outs.items() if v is not want}
    disagree = [k for k in errors if k not in ("transformers", "fastbert") and not _agrees(errors[k], cosine[k], dtype)]
    against = "transformers fp32" if dtype == torch.int8 else "fastbert"
    for k in disagree:
        print(f"# {k} disagrees with {against} on {name}: max abs err {errors[k]:.2e}, least cosine "
              f"{cosine[k]:.4f}; {dropped}", flush=True)
    return errors, cosine, disagree


def row_of(name, mask, errors, cosine, disagree, times) -> dict:
    """A workload's row from its errors and the seconds of each engine's timed calls."""
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    tokens = int(mask.sum())
    vs = {k: v / ms["fastbert"] for k, v in ms.items() if k != "fastbert"}
    return dict(workload=name, real_tokens=tokens, ms=ms, speedup=vs["transformers"], speedup_vs=vs,
                max_abs_err=errors.get("transformers", errors.get("fastbert")), errors=errors, least_cosine=cosine,
                disagree=disagree, tokens_per_s={k: tokens / v * 1e3 for k, v in ms.items()})


def isolated_rows(args, theirs, batches) -> tuple:
    """(rows, engines, {peer: why skipped}): every engine built and timed alone in a process of its own
    (fastbert.bench.isolated), `args.rounds` timed calls a pass, two passes; the ONNX file exported
    once here, in a temporary directory that goes when the children are done."""
    skipped = onnx_skips(args.peers, args.dtype)
    wanted = [p for p in args.peers if p not in skipped]
    with tempfile.TemporaryDirectory(prefix="fastbert-peers-") as d:
        path, trace = None, trace_batch(theirs.config)
        if wanted:
            path, failed = export_for(theirs, *trace, wanted, os.path.join(d, "model.onnx"))
            skipped.update(failed)
        outs, times, failed = isolated_engine_runs(args.model, args.layers, args.dtype,
                                                   ["fastbert", "transformers", *(wanted if path else [])], batches,
                                                   path, trace, calls=args.rounds)
    skipped.update(failed)
    print_skipped(skipped)
    rows = []
    for name, (_, mask) in batches.items():
        errors, cosine, disagree = agreement(name, {k: v[name] for k, v in outs.items()}, args.dtype,
                                             "its times left out")
        rows.append(row_of(name, mask, errors, cosine, disagree,
                           {k: v[name] for k, v in times.items() if k not in disagree}))
    return rows, [e for e in outs if e != "fastbert"], skipped


def _agrees(error: float, cosine: float, dtype) -> bool:
    if dtype == torch.int8:
        return cosine >= INT8_LEAST_COSINE  # NaN: False
    return error <= TOLERANCES[dtype]


def print_floor(rows, gemm: dict) -> None:
    """Each workload's floor at the machine's best fp32 GEMM rate, and what 2x transformers takes."""
    print(f"# the floor: the model's products at this machine's best fp32 GEMM rate, {gemm['gflops']:.0f} GFLOP/s "
          f"({gemm['by']}, {gemm['shape']}), measured at the start of the run")
    for row in rows:
        twice = row["ms"]["transformers"] / 2
        print(f"# {row['workload']}: {row['gflop']:.0f} GFLOP, floor {row['floor_ms']:.0f} ms; fastbert "
              f"{row['ms']['fastbert']:.0f} ms = {row['floor_ms'] / row['ms']['fastbert']:.0%} of the GEMM rate; "
              f"2x transformers = {twice:.0f} ms, which takes {row['gflop'] / twice * 1e3:.0f} GFLOP/s"
              + (" (past this machine's rate)" if twice < row["floor_ms"] else ""))


def print_header(names) -> None:
    cells = [f"{n} ms" for n in ("fastbert", *names)] + [f"vs {n}" for n in names] + [f"err {n}" for n in names]
    print(f"{'workload':<9}{'tokens':>8}" + "".join(f"{c:>{WIDTH}}" for c in cells), flush=True)


def print_row(row, names) -> None:
    ms, vs, err = row["ms"], row["speedup_vs"], row["errors"]
    cells = [f"{ms[n]:.1f}" if n in ms else "-" for n in ("fastbert", *names)]
    cells += [f"{vs[n]:.2f}x" if n in vs else "-" for n in names]
    cells += [f"{err[n]:.2e}" + ("!" if n in row["disagree"] else "") if n in err else "-" for n in names]
    print(f"{row['workload']:<9}{row['real_tokens']:>8}" + "".join(f"{c:>{WIDTH}}" for c in cells), flush=True)


def run(args) -> tuple:
    """(rows, {peer: why skipped})."""
    gemm = fp32_gemm_rate() if args.dtype == torch.float32 else None
    if args.in_process:
        theirs, ours = modern_models(args.model, args.layers, "cpp", int8=args.dtype == torch.int8)
    else:
        theirs = modern_transformers(args.model, args.layers)  # for the export; fastbert's is built in its child
    cfg, batches = theirs.config, {}
    for name in args.workloads:
        w = MODERN_WORKLOADS[name]
        batches[name] = make_batch(w["batch"], w["lo"], w["hi"], torch.Generator().manual_seed(1),
                                   vocab=cfg.vocab_size, pad_id=cfg.pad_token_id)
    if args.in_process:
        runs, skipped = engines(theirs, args.peers, args.dtype)
        if args.dtype == torch.bfloat16:  # after the export, which traces the fp32 model
            theirs.to(args.dtype)
            ours.to(args.dtype)
        names = list(runs)
        print_header(names)
        rows = []
        for name, (ids, mask) in batches.items():
            rows.append(measure(name, ours, runs, ids, mask, args.rounds, args.dtype))
            finish(rows[-1], cfg, mask, gemm)
            print_row(rows[-1], names)
    else:
        rows, names, skipped = isolated_rows(args, theirs, batches)
        print_header(names)
        for row, (_, mask) in zip(rows, batches.values()):
            finish(row, cfg, mask, gemm)
            print_row(row, names)
    if args.dtype == torch.int8:
        print("# vs X: X's ms / fastbert's ms. err X: max abs difference from transformers' fp32 last hidden state at "
              f"the real tokens; ! least cosine to it under {INT8_LEAST_COSINE} (its times left out). fastbert "
              "int8's own: " + ", ".join(f"{r['workload']} {r['errors']['fastbert']:.2e} (least cosine "
                                         f"{r['least_cosine']['fastbert']:.4f})" for r in rows))
    else:
        print(f"# vs X: X's ms / fastbert's ms. err X: max abs difference from fastbert's last hidden state at the "
              f"real tokens; ! beyond {TOLERANCES[args.dtype]:g} (its times left out)")
    print("# timed " + ("in this process, the engines' rounds interleaved" if args.in_process else
                        f"each engine alone in a process of its own, two passes of {args.rounds} calls"))
    if gemm is not None:
        print_floor(rows, gemm)
    return rows, skipped


def finish(row, config, mask, gemm) -> None:
    """The row's products (GFLOP) and, in fp32, its floor at the run's GEMM rate."""
    row["gflop"] = encoder_flops(config, mask.sum(1).tolist()) / 1e9
    if gemm is not None:
        row.update(floor_ms=row["gflop"] / gemm["gflops"] * 1e3, gemm=gemm)


def _versions(peers) -> dict:
    import importlib

    out = {}
    for package in ("transformers", *peers):
        try:
            out[package] = importlib.import_module(package).__version__
        except Exception:  # not installed: said where the peer is skipped
            pass
    return out


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--model", default="modernbert", choices=sorted(MODERN_ARCHS))
    ap.add_argument("--workloads", default=None,
                    help=f"of {', '.join(MODERN_WORKLOADS)} (default: {DEFAULT_WORKLOADS['modernbert']}; the "
                         f"others: {DEFAULT_WORKLOADS['mpnet']})")
    ap.add_argument("--layers", type=int, default=None, help="default: the model's base depth (22, 12, 24)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peers", default=",".join(ONNX_PEERS),
                    help=f"comma-separated, of {', '.join(ONNX_PEERS)} (default: both; '' for none)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"],
                    help="the models' dtype (bfloat16: OpenVINO at its bf16 inference precision, ONNX Runtime "
                         "skipped; int8: fastbert's and ONNX Runtime's int8 against transformers fp32)")
    ap.add_argument("--in-process", action="store_true",
                    help="time every engine in this process, their rounds interleaved (quicker; an engine's "
                         "thread pools then slow the ones timed after it); by default each runs alone in a "
                         "process of its own")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    args.layers = args.layers or MODERN_ARCHS[args.model][2]
    args.workloads = [w for w in (args.workloads or DEFAULT_WORKLOADS[args.model]).split(",") if w]
    unknown = [w for w in args.workloads if w not in MODERN_WORKLOADS]
    if unknown:
        ap.error(f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(MODERN_WORKLOADS)}")
    args.peers = [p for p in args.peers.split(",") if p]
    if any(p not in ONNX_PEERS for p in args.peers):
        ap.error(f"--peers: unknown {', '.join(p for p in args.peers if p not in ONNX_PEERS)}; "
                 f"choose from {', '.join(ONNX_PEERS)}")
    cmd = command_line(argv, "python benchmarks/bench_modernbert.py" if argv is not None else None)
    info = header(cmd, model=args.model, layers=args.layers, dtype=str(args.dtype).removeprefix("torch."),
                  **_versions(args.peers))
    rows, skipped = run(args)
    for peer, why in skipped.items():  # (said on stderr when it happened; again here, under the table)
        print(f"# {peer} not run: {why}")
    if args.json:
        write_json(args.json, cmd, info, rows, peers_skipped=skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
