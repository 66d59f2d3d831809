"""The HTTP app: text-embeddings-inference's routes and OpenAI's /v1/embeddings, an ASGI application
answering with Starlette's Request and Response (create_app says why not its router).

    POST /embed          {"inputs": str | [str], "normalize": true, "truncate": false, "prompt_name": null}
                         -> [[float]]
    POST /v1/embeddings  {"input": str | [str], "model": str, "encoding_format": "float" | "base64",
                          "dimensions": int} -> OpenAI's {"object": "list", "data": [...], "usage": {...}}
    POST /rerank         {"query": str, "texts": [str], "raw_scores": false, "return_text": false,
                          "truncate": false} -> [{"index", "score"(, "text")}], best first
    POST /predict        {"inputs": str | [str, str] | [str | [str, str]], "raw_scores": false,
                          "truncate": false} -> [{"score", "label"}] per input, best first
    POST /tokenize       {"inputs": str | [str], "add_special_tokens": true, "prompt_name": null}
    GET  /health, /info, /metrics

Errors are text-embeddings-inference's {"error": ..., "error_type": ...} (OpenAI's {"error":
{"message", "type", "code"}} on /v1/embeddings): 400 an empty input, 401 a wrong or missing API key,
404 a route the model does not serve (or no route at all), 405 a method the route does not take, 413
too many inputs or a text over the length limit without truncate, 422 a body that is not the JSON the
route takes, 429 a full queue, 500 a failed batch (or a defect, logged with its traceback).
"""
from __future__ import annotations

import base64
import logging
import time
from typing import Any, List, Optional

import numpy as np

from fastbert.serve.batching import Batcher, Overloaded
from fastbert.serve.metrics import Metrics
from fastbert.serve.model import CLASSIFY, EMBED, RERANK, InputError, Served


class Refused(Exception):
    def __init__(self, status: int, message: str, error_type: str):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


def _json_response(value: Any, status: int = 200):
    import orjson
    from starlette.responses import Response

    return Response(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json")


def _field(body: dict, name: str, kind, default):
    value = body.get(name, default)
    if value is None and default is None:
        return None
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise Refused(422, f"`{name}` must be {kind.__name__ if kind is not str else 'a string'}", "Validation")
    return value


class App:
    def __init__(self, served: Served, *, max_batch_tokens: int = 16384, max_concurrent_requests: int = 512,
                 max_client_batch_size: int = 32, api_key: Optional[str] = None, model_id: Optional[str] = None,
                 model_thread: bool = True):
        """model_thread=False: the batches run in the thread that calls app.batcher.work(), which
        should be the one that loaded the model (see fastbert.serve.batching)."""
        self.served = served
        self.metrics = Metrics()
        self.batcher = Batcher(served.run, max_batch_tokens=max_batch_tokens,
                               max_concurrent_requests=max_concurrent_requests, metrics=self.metrics,
                               thread=model_thread)
        self.max_batch_tokens = max_batch_tokens
        self.max_client_batch_size = max_client_batch_size
        self.api_key = api_key
        self.model_id = model_id or served.path

    # ---- request parsing

    async def _body(self, request) -> dict:
        import orjson

        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as e:
            raise Refused(422, f"the body is not valid JSON ({e})", "Validation") from None
        if not isinstance(body, dict):
            raise Refused(422, "the body must be a JSON object", "Validation")
        return body

    def _texts(self, body: dict, name: str) -> List[str]:
        value = body.get(name)
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise Refused(422, f"`{name}` must be a string or a list of strings", "Validation")
        self._count(len(texts), name)
        return texts

    def _count(self, n: int, name: str) -> None:
        if n == 0:
            raise Refused(400, f"`{name}` cannot be empty", "Empty")
        if n > self.max_client_batch_size:
            raise Refused(413, f"batch size {n} > maximum allowed batch size {self.max_client_batch_size} "
                               "(--max-client-batch-size)", "Validation")

    async def _run(self, rows, finish=None):
        """The model's outputs of the rows, or finish(outputs): the torch work runs in the model's
        worker, not on the event loop."""
        try:
            future = self.batcher.submit(rows, finish)
        except Overloaded as e:
            raise Refused(429, f"Model is overloaded: {e}", "Overloaded") from None
        try:
            return await future
        except Exception as e:  # noqa: BLE001 - a failed batch: this request fails, the server goes on
            raise Refused(500, f"the model failed on this batch ({type(e).__name__}: {e})", "Backend") from None

    def _needs(self, *kinds: str) -> None:
        if self.served.kind not in kinds:
            raise Refused(404, f"this server runs {_a(self.served.kind)} model; the route needs "
                               f"{' or '.join(map(_a, kinds))} model", "Validation")

    # ---- routes

    async def embed(self, request):
        self._needs(EMBED)
        body = await self._body(request)
        texts = self._texts(body, "inputs")
        rows = self.served.text_rows(texts, _field(body, "truncate", bool, False), _field(body, "prompt_name", str, None))
        normalize = _field(body, "normalize", bool, True)
        return _json_response(await self._run(rows, lambda out: _normalized(out, None, normalize)))

    async def openai_embeddings(self, request):
        self._needs(EMBED)
        body = await self._body(request)
        texts = self._texts(body, "input")
        fmt = _field(body, "encoding_format", str, "float")
        if fmt not in ("float", "base64"):
            raise Refused(422, f"`encoding_format` must be float or base64, got {fmt!r}", "Validation")
        dims = _field(body, "dimensions", int, None)
        if dims is not None and not 1 <= dims <= self.served.encoder.dim:
            raise Refused(422, f"`dimensions` must be in 1..{self.served.encoder.dim}, got {dims}", "Validation")
        rows = self.served.text_rows(texts, _field(body, "truncate", bool, False), _field(body, "prompt_name", str, None))
        out = await self._run(rows, lambda out: _normalized(out, dims, True))
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v}
                for i, v in enumerate(out)]
        tokens = sum(len(r) for r in rows)
        return _json_response({"object": "list", "data": data, "model": _field(body, "model", str, self.model_id),
                               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank(self, request):
        self._needs(RERANK)
        body = await self._body(request)
        query = _field(body, "query", str, None)
        if query is None:
            raise Refused(422, "`query` must be a string", "Validation")
        texts = self._texts(body, "texts")
        rows = self.served.pair_rows([(query, t) for t in texts], _field(body, "truncate", bool, False))
        raw = _field(body, "raw_scores", bool, False)
        scores = await self._run(rows, lambda out: self.served.scores(out, raw)[:, 0].tolist())
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep the texts' order
        with_text = _field(body, "return_text", bool, False)
        return _json_response([dict(index=i, score=scores[i], **({"text": texts[i]} if with_text else {}))
                               for i in order])

    async def predict(self, request):
        self._needs(RERANK, CLASSIFY)
        body = await self._body(request)
        inputs, single = _predict_inputs(body.get("inputs"))
        self._count(len(inputs), "inputs")
        truncate = _field(body, "truncate", bool, False)
        pairs = [x for x in inputs if isinstance(x, list)]
        if pairs and len(pairs) != len(inputs):
            raise Refused(422, "`inputs` must be all texts or all pairs of texts", "Validation")
        rows = (self.served.pair_rows(inputs, truncate) if pairs else self.served.text_rows(inputs, truncate))
        raw = _field(body, "raw_scores", bool, False)
        scores = await self._run(rows, lambda out: self.served.scores(out, raw).tolist())
        labels = self.served.labels
        answers = []
        for row in scores:
            answers.append(sorted(({"score": s, "label": labels[k]} for k, s in enumerate(row)), key=lambda d: -d["score"]))
        return _json_response(answers[0] if single else answers)

    async def tokenize(self, request):
        body = await self._body(request)
        texts = self._texts(body, "inputs")
        return _json_response(self.served.tokens(texts, _field(body, "add_special_tokens", bool, True),
                                                 _field(body, "prompt_name", str, None)))

    async def health(self, request):
        from starlette.responses import Response

        return Response(status_code=200)

    async def info(self, request):
        import fastbert

        served = self.served
        if served.kind == EMBED:
            model_type = {"embedding": {"pooling": ",".join(served.encoder.pooling_modes)}}
        else:
            model_type = {served.kind: {"id2label": {str(i): n for i, n in enumerate(served.labels)},
                                        "label2id": {n: i for i, n in enumerate(served.labels)}}}
        return _json_response({
            "model_id": self.model_id, "model_sha": None, "model_dtype": served.dtype, "model_type": model_type,
            "quantize": served.quantize, "max_concurrent_requests": self.batcher.max_concurrent_requests,
            "max_input_length": served.max_input_length, "max_batch_tokens": self.max_batch_tokens,
            "max_batch_requests": None, "max_client_batch_size": self.max_client_batch_size, "auto_truncate": False,
            "tokenization_workers": 1, "version": fastbert.__version__, "router": "fastbert",
        })

    async def metrics_page(self, request):
        from starlette.responses import Response

        return Response(self.metrics.text(), media_type="text/plain; version=0.0.4")


def _normalized(out: np.ndarray, dims: Optional[int], normalize: bool) -> np.ndarray:
    """The embeddings to send: the first `dims` dimensions (None: all), L2-normalized if `normalize`
    (as torch.nn.functional.normalize: each row over max(its norm, 1e-12))."""
    out = out[:, :dims] if dims else out
    if not normalize:
        return out
    norms = np.sqrt(np.einsum("ij,ij->i", out, out))[:, None]
    return out / np.maximum(norms, np.float32(1e-12))


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _predict_inputs(value):
    """(inputs: texts or [a, b] pairs, whether one input was sent), as text-embeddings-inference reads
    /predict's inputs: a string or a list of exactly two strings is one input."""
    if isinstance(value, str):
        return [value], True
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return [list(value)], True
    if isinstance(value, list) and all(isinstance(v, str) or (isinstance(v, list) and len(v) == 2 and
                                                              all(isinstance(s, str) for s in v)) for v in value):
        return list(value), False
    raise Refused(422, "`inputs` must be a text, a pair of texts, or a list of texts or of pairs", "Validation")


ROUTES = [("/embed", "POST", "embed"), ("/v1/embeddings", "POST", "openai_embeddings"), ("/rerank", "POST", "rerank"),
          ("/predict", "POST", "predict"), ("/tokenize", "POST", "tokenize"), ("/health", "GET", "health"),
          ("/info", "GET", "info"), ("/metrics", "GET", "metrics_page")]
OPEN_ROUTES = ("/health",)  # answered without the API key (load balancers' probes)


def create_app(app: App):
    """The ASGI application of `app`: its routes, errors, API key check and metrics.

    A request is dispatched on its (path, method) from a dict and read and answered with
    Starlette's Request and Response. Starlette's router and middleware stack (the routes' patterns
    tried in turn, three exception layers) took about a third of the event loop's time per short
    query (MiniLM at 1,000 requests/s), time the model's threads lose on a machine with few cores.
    A route that does not exist is answered 404, a method the route does not take 405, both in the
    route's error form; an unexpected exception is logged with its traceback and answered 500."""
    from starlette.requests import ClientDisconnect, Request

    handlers = {}
    for path, method, name in ROUTES:
        handlers[path, method] = _endpoint(app, path, getattr(app, name))
        if method == "GET":
            handlers[path, "HEAD"] = handlers[path, method]
    allowed = {path: sorted(m for p, m in handlers if p == path) for path, _, _ in ROUTES}

    async def asgi(scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send, app.batcher.stop)
        if scope["type"] != "http":
            return None  # websockets: not served
        path, method = scope["path"], scope["method"]
        handler = handlers.get((path, method))
        if handler is None and path in allowed:
            takes = ", ".join(allowed[path])
            response = _error(path, 405, f"{method} {path}: the route takes {takes}", "Validation")
            response.headers["allow"] = takes
        elif handler is None:
            response = _error(path, 404, f"no route {path}", "Validation")
        else:
            try:
                response = await handler(Request(scope, receive))
            except ClientDisconnect:
                return None  # the client went away before its body arrived: nobody to answer
        return await response(scope, receive, send)

    return asgi


def _endpoint(app: App, path: str, handler):
    """handler(request) with the API key check, the routes' errors and the request metrics."""
    from starlette.requests import ClientDisconnect

    async def endpoint(request):
        t0 = time.perf_counter()
        try:
            if app.api_key is not None and path not in OPEN_ROUTES:
                if request.headers.get("authorization", "") != f"Bearer {app.api_key}":
                    raise Refused(401, "Unauthorized: a wrong or missing API key", "Unauthorized")
            response = await handler(request)
        except InputError as e:
            response = _error(path, 413, str(e), "Validation")
        except Refused as e:
            response = _error(path, e.status, e.message, e.error_type)
        except ClientDisconnect:
            raise
        except Exception as e:  # noqa: BLE001 - a defect: logged whole, answered 500, the server goes on
            logging.getLogger("uvicorn.error").exception("%s failed", path)
            first = (str(e).strip().splitlines() or [""])[0]  # one line; the log has the rest
            response = _error(path, 500, f"internal error ({type(e).__name__}: {first})", "Backend")
        app.metrics.answered(path, response.status_code, time.perf_counter() - t0)
        return response
    return endpoint


async def _lifespan(receive, send, stop) -> None:
    """ASGI's lifespan protocol: nothing to start; at shutdown, stop(), after the requests in flight."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            stop()
            await send({"type": "lifespan.shutdown.complete"})
            return


def _error(path: str, status: int, message: str, error_type: str):
    if path.startswith("/v1/"):
        return _json_response({"error": {"message": message, "type": error_type, "code": status}}, status)
    return _json_response({"error": message, "error_type": error_type}, status)

