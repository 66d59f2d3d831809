"""The HTTP app: text-embeddings-inference's routes and OpenAI's /v1/embeddings, an ASGI application
answering with Starlette's Request and Response (create_app says why not its router).

    POST /embed          {"inputs": str | [str], "normalize": true, "truncate": false, "prompt_name": null}
                         -> [[float]]
    POST /embed_sparse   {"inputs", "truncate", "prompt_name"} -> [[{"index", "value"}]]: BGE-M3's sparse weights
    POST /embed_all      {"inputs", "truncate", "prompt_name"} -> [[[float]]]: token vectors (ColBERT's, BGE-M3)
    POST /v1/embeddings  {"input": str | [str], "model": str, "encoding_format": "float" | "base64",
                          "dimensions": int} -> OpenAI's {"object": "list", "data": [...], "usage": {...}}
    POST /rerank         {"query": str, "texts": [str], "raw_scores": false, "return_text": false,
                          "truncate": false} -> [{"index", "score"(, "text")}], best first
    POST /predict        {"inputs": str | [str, str] | [str | [str, str]], "raw_scores": false,
                          "truncate": false} -> [{"score", "label"}] per input, best first
    POST /tokenize       {"inputs": str | [str], "add_special_tokens": true, "prompt_name": null}
    GET  /health, /info, /metrics
    GET  /openapi.json, /docs   the description of the routes this server answers (fastbert.serve.openapi)

ROUTES is the one table of the routes: what each takes (its body's fields, fastbert.serve.fields),
answers and needs. The bodies are checked through it and the description is made from it.

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
from typing import Any, Dict, List, Optional

import numpy as np

from fastbert import token_outputs
from fastbert.serve.batching import Batcher, Overloaded
from fastbert.serve.engine import CLASSIFY, EMBED, RERANK, InputError, Served
from fastbert.serve.fields import BOOL, PREDICT_INPUTS, PROMPT, STRING, TEXTS, Field, FieldError, int_up_to, one_of, read
from fastbert.serve.metrics import Metrics
from fastbert.serve.openapi import STATUSES, Route, describe, docs_page, openai_style


class Refused(Exception):
    """A request answered with an error: its status and message (the error type follows from the status)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, STATUSES[status][0]


def _json_response(value: Any, status: int = 200):
    import orjson
    from starlette.responses import Response

    return Response(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json")


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
        # the bounds of the bodies' fields that belong to this server and model
        self.limits: Dict[str, Any] = {"max_client_batch_size": max_client_batch_size, "prompts": served.prompts}
        if served.kind == EMBED:
            self.limits["dim"] = served.encoder.dim
        self._description: Optional[dict] = None

    # ---- request parsing

    async def args(self, request, fields) -> Dict[str, Any]:
        """The values of the body's fields (defaults filled in); Refused 422 for a body that is not
        a JSON object of them."""
        import orjson

        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as e:
            raise Refused(422, f"the body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise Refused(422, "the body must be a JSON object")
        try:
            return read(body, fields, self.limits)
        except FieldError as e:
            raise Refused(422, str(e)) from None

    def _texts(self, value, name: str) -> List[str]:
        texts = [value] if isinstance(value, str) else value
        self._count(len(texts), name)
        return texts

    def _count(self, n: int, name: str) -> None:
        if n == 0:
            raise Refused(400, f"`{name}` cannot be empty")
        if n > self.max_client_batch_size:
            raise Refused(413, f"batch size {n} > maximum allowed batch size {self.max_client_batch_size} "
                               "(--max-client-batch-size)")

    async def _run(self, rows, finish=None, outputs=None):
        """The model's outputs of the rows (or its named outputs: Batcher.submit), or
        finish(outputs): the torch work runs in the model's worker, not on the event loop."""
        try:
            future = self.batcher.submit(rows, finish, outputs)
        except Overloaded as e:
            raise Refused(429, f"Model is overloaded: {e}") from None
        try:
            return await future
        except Exception as e:  # noqa: BLE001 - a failed batch: this request fails, the server goes on
            raise Refused(500, f"the model failed on this batch ({type(e).__name__}: {e})") from None

    def needs(self, route: Route) -> None:
        """Refused 404 when the served model does not answer the route."""
        if route.models is not None and self.served.kind not in route.models:
            raise Refused(404, f"this server runs {_a(self.served.kind)} model; the route needs "
                               f"{' or '.join(map(_a, route.models))} model")
        if not route.answers(self.served.kind, self.served.outputs):
            raise Refused(404, f"{token_outputs.lacking([route.output], self.served.outputs)}; the route needs "
                               f"{route.output} vectors")

    # ---- routes: each takes the values of its body's fields (ROUTES)

    async def embed(self, args):
        rows = self.served.text_rows(self._texts(args["inputs"], "inputs"), args["truncate"], args["prompt_name"])
        normalize = args["normalize"]
        return _json_response(await self._run(rows, lambda out: _normalized(out, None, normalize)))

    async def embed_sparse(self, args):
        rows = self.served.text_rows(self._texts(args["inputs"], "inputs"), args["truncate"], args["prompt_name"])
        return _json_response(await self._run(rows, lambda out: [
            [{"index": int(i), "value": float(v)} for i, v in zip(ids.tolist(), weights.tolist())]
            for ids, weights in out["sparse"]], ("sparse",)))

    async def embed_all(self, args):
        # the model's token vectors: BGE-M3's ColBERT vectors where it ships that head, else (as
        # text-embeddings-inference) every token's last hidden state
        rows = self.served.text_rows(self._texts(args["inputs"], "inputs"), args["truncate"], args["prompt_name"])
        name = "colbert" if "colbert" in self.served.outputs else "tokens"
        return _json_response(await self._run(rows, lambda out: out[name], (name,)))

    async def openai_embeddings(self, args):
        rows = self.served.text_rows(self._texts(args["input"], "input"), args["truncate"], args["prompt_name"])
        dims, fmt = args["dimensions"], args["encoding_format"]
        out = await self._run(rows, lambda out: _normalized(out, dims, True))
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v}
                for i, v in enumerate(out)]
        tokens = sum(len(r) for r in rows)
        model = self.model_id if args["model"] is None else args["model"]
        return _json_response({"object": "list", "data": data, "model": model,
                               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank(self, args):
        texts = self._texts(args["texts"], "texts")
        rows = self.served.pair_rows([(args["query"], t) for t in texts], args["truncate"])
        raw = args["raw_scores"]
        scores = await self._run(rows, lambda out: self.served.scores(out, raw)[:, 0].tolist())
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep the texts' order
        with_text = args["return_text"]
        return _json_response([dict(index=i, score=scores[i], **({"text": texts[i]} if with_text else {}))
                               for i in order])

    async def predict(self, args):
        inputs, single = _predict_inputs(args["inputs"])
        self._count(len(inputs), "inputs")
        truncate = args["truncate"]
        pairs = isinstance(inputs[0], list)  # all pairs or all texts (PREDICT_INPUTS)
        rows = (self.served.pair_rows(inputs, truncate) if pairs else self.served.text_rows(inputs, truncate))
        raw = args["raw_scores"]
        scores = await self._run(rows, lambda out: self.served.scores(out, raw).tolist())
        labels = self.served.labels
        answers = []
        for row in scores:
            answers.append(sorted(({"score": s, "label": labels[k]} for k, s in enumerate(row)), key=lambda d: -d["score"]))
        return _json_response(answers[0] if single else answers)

    async def tokenize(self, args):
        texts = self._texts(args["inputs"], "inputs")
        return _json_response(self.served.tokens(texts, args["add_special_tokens"], args["prompt_name"]))

    async def health(self, args):
        from starlette.responses import Response

        return Response(status_code=200)

    async def info(self, args):
        import fastbert

        served = self.served
        if served.kind == EMBED:
            # (text-embeddings-inference names a SPLADE model's pooling "splade")
            pooling = "splade" if served.encoder.splade is not None else ",".join(served.encoder.pooling_modes)
            model_type = {"embedding": {"pooling": pooling}}
        else:
            model_type = {served.kind: {"id2label": {str(i): n for i, n in enumerate(served.labels)},
                                        "label2id": {n: i for i, n in enumerate(served.labels)}}}
        return _json_response({
            "model_id": self.model_id, "model_sha": None, "model_dtype": served.dtype, "model_type": model_type,
            "quantize": served.quantize, "quantization": served.quantization,
            "max_concurrent_requests": self.batcher.max_concurrent_requests,
            "max_input_length": served.max_input_length, "max_batch_tokens": self.max_batch_tokens,
            "max_batch_requests": None, "max_client_batch_size": self.max_client_batch_size, "auto_truncate": False,
            "tokenization_workers": 1, "version": fastbert.__version__, "router": "fastbert",
        })

    async def metrics_page(self, args):
        from starlette.responses import Response

        return Response(self.metrics.text(), media_type="text/plain; version=0.0.4")

    def description(self) -> dict:
        """The OpenAPI document of the routes this server answers (made once)."""
        if self._description is None:
            import fastbert

            self._description = describe(ROUTES, kind=self.served.kind, limits=self.limits,
                                         api_key=self.api_key is not None, model_id=self.model_id,
                                         version=fastbert.__version__, outputs=self.served.outputs)
        return self._description

    async def openapi(self, args):
        return _json_response(self.description())

    async def docs(self, args):
        from starlette.responses import HTMLResponse

        return HTMLResponse(docs_page(self.description()))


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
    """(inputs: texts or [a, b] pairs, whether one input was sent) of /predict's checked `inputs`, as
    text-embeddings-inference reads them: a string or a list of exactly two strings is one input."""
    if isinstance(value, str):
        return [value], True
    if len(value) == 2 and all(isinstance(v, str) for v in value):
        return [list(value)], True
    return list(value), False


# ---- the route table: the bodies' fields (checked and described alike) and the answers' schemas

_HANGUL = "한국어 문장을 임베딩합니다"
_TRUNCATE = Field("truncate", BOOL, False, "cut an input longer than the model takes instead of answering 413")
_PROMPT = Field("prompt_name", PROMPT, None, "one of the model's prompts (config_sentence_transformers.json), "
                "put before each text")
_RAW = Field("raw_scores", BOOL, False, "the logits instead of the model's activation of them")
_TEXTS_EXAMPLES = ("What is Deep Learning?", ["안녕하세요 세계", "Deep Learning is a kind of machine learning"])

EMBED_BODY = (Field("inputs", TEXTS, doc="the text or texts to embed", examples=_TEXTS_EXAMPLES),
              Field("normalize", BOOL, True, "L2-normalize each embedding"), _TRUNCATE, _PROMPT)
TOKEN_VECTORS_BODY = (Field("inputs", TEXTS, doc="the text or texts to embed", examples=_TEXTS_EXAMPLES), _TRUNCATE,
                      _PROMPT)
OPENAI_BODY = (Field("input", TEXTS, doc="the text or texts to embed", examples=_TEXTS_EXAMPLES),
               Field("model", STRING, None, "any name, answered back (default: the server's --model-id)"),
               Field("encoding_format", one_of("float", "base64"), "float",
                     "base64: each embedding's little-endian float32 bytes in base64"),
               Field("dimensions", int_up_to("dim"), None, "the first N dimensions of each embedding, renormalized"),
               _TRUNCATE, _PROMPT)
RERANK_BODY = (Field("query", STRING, doc="the query", examples=("딥러닝이란 무엇인가요?",)),
               Field("texts", TEXTS, doc="the texts to rank against the query",
                     examples=([_HANGUL, "Deep Learning is a kind of machine learning"],)),
               _RAW, Field("return_text", BOOL, False, "each answer carries its text"), _TRUNCATE)
PREDICT_BODY = (Field("inputs", PREDICT_INPUTS, doc="a text, a pair of texts (one input), or a list of texts or of pairs",
                      examples=(_HANGUL, ["딥러닝이란 무엇인가요?", _HANGUL], [["a question", "an answer"]])),
                _RAW, _TRUNCATE)
TOKENIZE_BODY = (Field("inputs", TEXTS, doc="the text or texts to tokenize", examples=_TEXTS_EXAMPLES),
                 Field("add_special_tokens", BOOL, True, "the model's special tokens ([CLS], [SEP]) included"),
                 _PROMPT)

_NUMBERS = {"type": "array", "items": {"type": "number"}}
_SPARSE = {"type": "array", "items": {"type": "object", "required": ["index", "value"], "properties": {
    "index": {"type": "integer"}, "value": {"type": "number"}}}}
_OPENAI_DATA = {"type": "object", "required": ["object", "index", "embedding"],
                "properties": {"object": {"const": "embedding"}, "index": {"type": "integer"},
                               "embedding": {"oneOf": [_NUMBERS, {"type": "string", "contentEncoding": "base64"}]}}}
_OPENAI_ANSWER = {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
    "object": {"const": "list"}, "data": {"type": "array", "items": _OPENAI_DATA}, "model": {"type": "string"},
    "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
              "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}}}}
_RANKS = {"type": "array", "items": {"type": "object", "required": ["index", "score"], "properties": {
    "index": {"type": "integer"}, "score": {"type": "number"}, "text": {"type": "string"}}}}
_LABELS = {"type": "array", "items": {"type": "object", "required": ["score", "label"],
                                      "properties": {"score": {"type": "number"}, "label": {"type": "string"}}}}
_TOKEN = {"type": "object", "required": ["id", "text", "special", "start", "stop"], "properties": {
    "id": {"type": "integer"}, "text": {"type": "string"}, "special": {"type": "boolean"},
    "start": {"type": ["integer", "null"]}, "stop": {"type": ["integer", "null"]}}}
_INFO = {"type": "object", "required": ["model_id", "model_type", "max_input_length", "max_client_batch_size", "version"],
         "properties": {"model_id": {"type": "string"}, "model_dtype": {"type": "string"}, "model_type": {"type": "object"},
                        "max_input_length": {"type": "integer"}, "max_batch_tokens": {"type": "integer"},
                        "max_concurrent_requests": {"type": "integer"}, "max_client_batch_size": {"type": "integer"},
                        "version": {"type": "string"}}}

ROUTES = [
    Route("/embed", "POST", "embed", "Embed texts (text-embeddings-inference's /embed)",
          {"type": "array", "items": _NUMBERS}, body=EMBED_BODY, models=(EMBED,), runs_model=True, output="dense"),
    Route("/embed_sparse", "POST", "embed_sparse", "Each text's sparse lexical weights, {index: token id, value}, "
          "ids ascending (text-embeddings-inference's /embed_sparse; BGE-M3's sparse head)",
          {"type": "array", "items": _SPARSE}, body=TOKEN_VECTORS_BODY, models=(EMBED,), runs_model=True,
          output="sparse"),
    Route("/embed_all", "POST", "embed_all", "Each text's token vectors (text-embeddings-inference's /embed_all): "
          "BGE-M3's ColBERT vectors (every token after the first, normalised) where the model ships that head, "
          "else every token's last hidden state", {"type": "array", "items": {"type": "array", "items": _NUMBERS}},
          body=TOKEN_VECTORS_BODY, models=(EMBED,), runs_model=True, output="tokens"),
    Route("/v1/embeddings", "POST", "openai_embeddings", "Embed texts (OpenAI's embeddings API)", _OPENAI_ANSWER,
          body=OPENAI_BODY, models=(EMBED,), runs_model=True, output="dense"),
    Route("/rerank", "POST", "rerank", "Score texts against a query, best first", _RANKS, body=RERANK_BODY,
          models=(RERANK,), runs_model=True),
    Route("/predict", "POST", "predict", "Every label's score of a text or pair of texts, best first (a list of "
          "inputs: one list per input)", {"anyOf": [_LABELS, {"type": "array", "items": _LABELS}]}, body=PREDICT_BODY,
          models=(RERANK, CLASSIFY), runs_model=True),
    Route("/tokenize", "POST", "tokenize", "The tokens of texts, with their character offsets",
          {"type": "array", "items": {"type": "array", "items": _TOKEN}}, body=TOKENIZE_BODY),
    Route("/health", "GET", "health", "An empty 200 once the model is loaded", media_type=None, open=True),
    Route("/info", "GET", "info", "The model and the server's settings", _INFO),
    Route("/metrics", "GET", "metrics_page", "Prometheus metrics", media_type="text/plain"),
    Route("/openapi.json", "GET", "openapi", "This description (OpenAPI 3.1)", {"type": "object"}, open=True),
    Route("/docs", "GET", "docs", "This description as a page", media_type="text/html", open=True),
]


def create_app(app: App):
    """The ASGI application of `app`: its routes, errors, API key check and metrics.

    A request is dispatched on its (path, method) from a dict and read and answered with
    Starlette's Request and Response. Starlette's router and middleware stack (the routes' patterns
    tried in turn, three exception layers) took a large share of the event loop's time per short
    query (benchmarks/LOG.md, "fastbert serve at 64 clients: work claimed, not shared out, and a
    shorter request path"), time the model's threads lose on a machine with few cores.
    A route that does not exist is answered 404, a method the route does not take 405, both in the
    route's error form; an unexpected exception is logged with its traceback and answered 500."""
    from starlette.requests import ClientDisconnect, Request

    handlers = {}
    for route in ROUTES:
        handlers[route.path, route.method] = _endpoint(app, route)
        if route.method == "GET":
            handlers[route.path, "HEAD"] = handlers[route.path, route.method]
    allowed = {route.path: sorted(m for p, m in handlers if p == route.path) for route in ROUTES}

    async def asgi(scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send, app.batcher.stop)
        if scope["type"] != "http":
            return None  # websockets: not served
        path, method = scope["path"], scope["method"]
        handler = handlers.get((path, method))
        if handler is None and path in allowed:
            takes = ", ".join(allowed[path])
            response = _error(path, 405, f"{method} {path}: the route takes {takes}")
            response.headers["allow"] = takes
        elif handler is None:
            response = _error(path, 404, f"no route {path}")
        else:
            try:
                response = await handler(Request(scope, receive))
            except ClientDisconnect:
                return None  # the client went away before its body arrived: nobody to answer
        return await response(scope, receive, send)

    return asgi


def _endpoint(app: App, route: Route):
    """The route's handler, given its body's values, with the API key check, the route's errors and
    the request metrics."""
    from starlette.requests import ClientDisconnect

    handler, path = getattr(app, route.handler), route.path

    async def endpoint(request):
        t0 = time.perf_counter()
        try:
            if app.api_key is not None and not route.open:
                if request.headers.get("authorization", "") != f"Bearer {app.api_key}":
                    raise Refused(401, "Unauthorized: a wrong or missing API key")
            app.needs(route)
            response = await handler(await app.args(request, route.body) if route.body else {})
        except InputError as e:
            response = _error(path, 413, str(e))
        except Refused as e:
            response = _error(path, e.status, e.message)
        except ClientDisconnect:
            raise
        except Exception as e:  # noqa: BLE001 - a defect: logged whole, answered 500, the server goes on
            logging.getLogger("uvicorn.error").exception("%s failed", path)
            first = (str(e).strip().splitlines() or [""])[0]  # one line; the log has the rest
            response = _error(path, 500, f"internal error ({type(e).__name__}: {first})")
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


def _error(path: str, status: int, message: str):
    error_type = STATUSES[status][0]
    if openai_style(path):
        return _json_response({"error": {"message": message, "type": error_type, "code": status}}, status)
    return _json_response({"error": message, "error_type": error_type}, status)
