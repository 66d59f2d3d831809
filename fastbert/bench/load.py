"""The serving benchmark's load: closed-loop HTTP clients in a process of their own.

`concurrency` tasks, each on a keep-alive HTTP/1.1 connection of its own: every task sends a
request, waits for its answer and sends the next one at once. After `warmup` seconds a window of at
least `duration` seconds opens; it is stretched (up to `max_window` seconds) until `min_samples`
requests have finished in it. Then no request is sent any more, and the ones in flight are awaited.
Throughput counts each request by the share of its lifetime that lies inside the window, so a window
that opens or closes in the middle of a round of slow requests neither gains nor loses part of a
round; the latencies are those of the requests that overlap the window. During the window the client
process also reads its own CPU time, the server's (/proc/PID/stat) and, for fastbert serve, its
/metrics (time the model ran, sequences per batch).

The client speaks HTTP/1.1 itself on asyncio streams (uvloop's loop where it is installed): each
request's bytes are made once, and an answer is read by its Content-Length (or its chunks). The
clients share the machine with the server, so what they spend is taken from it: httpx, the client
used before, spent enough CPU on each request to take a large share of a core at concurrency 64
(benchmarks/LOG.md, "bench_serve's clients without httpx"), which the servers' throughput and
every latency paid for on 2 cores.

This file runs as a script (`python -I load.py`, a JSON spec on standard input, a JSON result on
standard output) and then imports nothing but the standard library (and uvloop), so the client
process stays small.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class _ClosedBeforeAnswer(ConnectionError):
    """The connection ended before any byte of the answer."""


class Connection:
    """One keep-alive HTTP/1.1 connection to url's host; `request` sends bytes made by `message`."""

    def __init__(self, url: str, timeout: float):
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname, parts.port or 80, timeout
        self.streams: Optional[Tuple[asyncio.StreamReader, asyncio.StreamWriter]] = None

    def message(self, method: str, path: str, body: bytes = b"") -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        return head.encode() + b"\r\n" + body

    async def request(self, message: bytes) -> Tuple[int, bytes]:
        """(status, body) of the answer; the connection is opened again after a failure. A kept-alive
        connection the server closed while it sat idle (uvicorn: after 5 s) is opened again and the
        request sent once more, as HTTP clients do."""
        reused = self.streams is not None
        try:
            try:
                return await asyncio.wait_for(self._exchange(message), self.timeout)
            except _ClosedBeforeAnswer:
                if not reused:
                    raise
                self.close()
                return await asyncio.wait_for(self._exchange(message), self.timeout)
        except BaseException:
            self.close()
            raise

    async def _exchange(self, message: bytes) -> Tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        writer.write(message)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            if isinstance(e, asyncio.IncompleteReadError) and e.partial:
                raise
            raise _ClosedBeforeAnswer("the server closed the connection before answering") from e
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                body += (await reader.readexactly(size + 2))[:size]
                if size == 0:
                    break
        else:
            body = await reader.readexactly(int(fields.get("content-length", 0)))
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, body

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


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

    def __init__(self, connection: Connection, server_pid: int, metrics: bool):
        self.connection, self.pid, self.metrics = connection, server_pid, metrics
        self.marks: List[dict] = []

    async def mark(self) -> None:
        m = {"t": time.perf_counter(), "client_cpu": time.process_time(), "server_cpu": cpu_seconds(self.pid)}
        if self.metrics:
            try:
                _, page = await self.connection.request(self.connection.message("GET", "/metrics"))
                m.update(_prometheus_sums(page.decode()))
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
    tokens, texts = spec["tokens"], spec["texts_per_request"]
    c = spec["concurrency"]
    connections = [Connection(spec["url"], spec.get("timeout", 600)) for _ in range(c + 1)]
    messages = [connections[0].message("POST", spec["path"], b.encode()) for b in spec["bodies"]]
    done: List[tuple] = []  # (start, end, request index, "" or what went wrong)
    state = {"stop": False}

    async def client(k: int, connection: Connection) -> None:
        i = k * len(messages) // c
        while not state["stop"]:
            t0 = time.perf_counter()
            try:
                status, _ = await connection.request(messages[i])
                ok = "" if status == 200 else f"HTTP {status}"
            except (OSError, EOFError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                ok = type(e).__name__
            done.append((t0, time.perf_counter(), i, ok))
            i = (i + 1) % len(messages)

    try:
        probe = _Probe(connections[c], spec.get("server_pid", 0), spec.get("metrics", False))
        tasks = [asyncio.create_task(client(k, connections[k])) for k in range(c)]
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
        for connection in connections:
            connection.close()
    return summary(done, probe, tokens, texts)


def summary(done: List[tuple], probe: _Probe, tokens: List[int], texts: int) -> dict:
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
    proc = subprocess.run([sys.executable, "-I", os.path.abspath(__file__)], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the client process failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout)


def _main() -> None:
    spec = json.loads(sys.stdin.read())
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(_load(spec))
    else:
        result = uvloop.run(_load(spec))
    print(json.dumps(result))


if __name__ == "__main__":
    _main()
