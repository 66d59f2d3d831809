"""The ASGI application in process, through httpx's ASGI transport, on a stand-in model: a route that
does not exist is a 404 and a method a route does not take a 405 (with Allow), both in the routes'
JSON error form; HEAD works where GET does; a defect in a handler is logged with its traceback,
answered 500 and counted, and the next request is answered; the lifespan's shutdown stops the
batcher."""
import asyncio
import logging
from types import SimpleNamespace

import pytest
import torch

httpx = pytest.importorskip("httpx", reason="the serve extra's client: pip install -e '.[serve]'")
pytest.importorskip("starlette", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="the serve extra: pip install -e '.[serve]'")

from fastbert.serve.app import App, create_app  # noqa: E402
from fastbert.serve.engine import EMBED  # noqa: E402

pytestmark = pytest.mark.serve


class StandIn:
    """What App reads of a served model: one embedding of ones a text; the text "boom" is a defect."""

    kind, path, outputs = EMBED, "stand-in", frozenset({"dense", "tokens"})
    encoder, prompts = SimpleNamespace(dim=4), []

    def text_rows(self, texts, truncate, prompt_name=None):
        if "boom" in texts:
            raise RuntimeError("the tokenizer broke\nat its third stage")  # the answer keeps the first line
        return [[1, 2, 3] for _ in texts]

    def run(self, rows):
        return torch.ones(len(rows), 4)


def _requests(asgi, calls):
    async def go():
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://fastbert") as http:
            return [await http.request(method, path, **kw) for method, path, kw in calls]
    return asyncio.run(go())


def test_unknown_routes_wrong_methods_and_defects_are_json_errors(caplog):
    app = App(StandIn(), max_batch_tokens=64)
    try:
        with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
            missing, wrong, head, boom, fine, openai_wrong = _requests(create_app(app), [
                ("POST", "/nowhere", {"json": {}}), ("GET", "/embed", {}), ("HEAD", "/health", {}),
                ("POST", "/embed", {"json": {"inputs": ["boom"]}}), ("POST", "/embed", {"json": {"inputs": "x"}}),
                ("GET", "/v1/embeddings", {})])
    finally:
        app.batcher.stop()
    assert missing.status_code == 404 and missing.json() == {"error": "no route /nowhere", "error_type": "Validation"}
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST" and "takes POST" in wrong.json()["error"]
    assert openai_wrong.status_code == 405 and openai_wrong.json()["error"]["code"] == 405  # OpenAI's form
    assert head.status_code == 200
    assert boom.status_code == 500 and boom.json() == {
        "error": "internal error (RuntimeError: the tokenizer broke)", "error_type": "Backend"}
    assert fine.status_code == 200 and fine.json() == [[0.5, 0.5, 0.5, 0.5]]  # normalized ones
    logged = [r for r in caplog.records if r.name == "uvicorn.error"]
    assert len(logged) == 1 and "/embed failed" in logged[0].getMessage() and logged[0].exc_info[0] is RuntimeError
    assert b'fastbert_request_total{route="/embed",status="500"} 1.0' in app.metrics.text()


def test_lifespan_shutdown_stops_the_batcher():
    app = App(StandIn(), max_batch_tokens=64)
    sent = []

    async def lifespan():
        messages = asyncio.Queue()
        for kind in ("lifespan.startup", "lifespan.shutdown"):
            messages.put_nowait({"type": kind})

        async def send(message):
            sent.append(message["type"])

        await create_app(app)({"type": "lifespan"}, messages.get, send)

    asyncio.run(lifespan())
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert not app.batcher.thread.is_alive()
