"""The server's description: GET /openapi.json (OpenAPI 3.1, as text-embeddings-inference publishes
one) and GET /docs (the same, as a page that needs nothing but itself: no script, no stylesheet
from elsewhere), both made from the route table of fastbert.serve.app.

Each route is a `Route`: its path and method, the App method that answers it, its body's fields
(fastbert.serve.fields: the same table checks the bodies), the schema of what it answers, and which
models answer it. The statuses a route gives follow from what it does:

    200  always
    400  an empty input                                        routes that take inputs
    401  a wrong or missing API key                            with --api-key, every route but the open ones
    405  a method the route does not take (Allow names those it takes)
    413  too many inputs, a text over the length limit, an unknown prompt_name    routes that take inputs
    422  a body that is not the JSON the route takes           routes with a body
    429  a full queue, 500 a failed batch                      routes that run the model

The description lists the routes the served model answers; the others (/rerank and /predict on an
embedding model, /embed and /v1/embeddings on a reranker or classifier or a SPLADE model,
/embed_sparse on a model without sparse vectors) answer 404 and are named in the description's summary. Errors are
text-embeddings-inference's {"error", "error_type"}, OpenAI's
{"error": {"message", "type", "code"}} under /v1/.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from fastbert.serve.fields import PREDICT_INPUTS, TEXTS, Field, body_schema

# status -> (error_type, when)
STATUSES: Dict[int, Tuple[str, str]] = {
    400: ("Empty", "an empty input"),
    401: ("Unauthorized", "a wrong or missing API key (Authorization: Bearer KEY)"),
    404: ("Validation", "a route this server does not have, or one for another kind of model"),
    405: ("Validation", "a method the route does not take (the Allow header names the ones it takes)"),
    413: ("Validation", "too many inputs (--max-client-batch-size), a text longer than the model takes without "
                        "truncate, or a prompt_name the model does not have"),
    422: ("Validation", "a body that is not the JSON the route takes"),
    429: ("Overloaded", "the queue is full (--max-concurrent-requests)"),
    500: ("Backend", "the model failed on the batch"),
}


@dataclass(frozen=True)
class Route:
    path: str
    method: str
    handler: str  # the App method that answers it
    summary: str
    answer: Optional[dict] = None  # the JSON Schema of a 200 answer (None: see media_type)
    media_type: Optional[str] = "application/json"  # of a 200 answer; None: an empty answer
    body: Sequence[Field] = ()
    models: Optional[Tuple[str, ...]] = None  # the kinds of model that answer it; None: every kind
    runs_model: bool = False
    open: bool = False  # answered without the API key
    output: Optional[str] = None  # what the embedding model must give: "dense", "sparse" (BGE-M3's or SPLADE's)...

    def answers(self, kind: str, outputs: frozenset = frozenset()) -> bool:
        return (self.models is None or kind in self.models) and (self.output is None or self.output in outputs)

    def statuses(self, api_key: bool) -> List[int]:
        takes_inputs = any(f.kind in (TEXTS, PREDICT_INPUTS) for f in self.body)
        out = {200, 405}
        out |= {401} if api_key and not self.open else set()
        out |= {400, 413} if takes_inputs else set()
        out |= {422} if self.body else set()
        out |= {413, 429, 500} if self.runs_model else set()
        return sorted(out)


def openai_style(path: str) -> bool:
    """Whether the route's errors are OpenAI's {"error": {"message", "type", "code"}}."""
    return path.startswith("/v1/")


def error_schema(path: str, status: int) -> dict:
    error_type = {"type": "string", "enum": [STATUSES[status][0]]}
    if openai_style(path):
        inner = {"type": "object", "required": ["message", "type", "code"],
                 "properties": {"message": {"type": "string"}, "type": error_type,
                                "code": {"type": "integer", "enum": [status]}}}
        return {"type": "object", "required": ["error"], "properties": {"error": inner}}
    return {"type": "object", "required": ["error", "error_type"],
            "properties": {"error": {"type": "string"}, "error_type": error_type}}


def _responses(route: Route, api_key: bool) -> dict:
    out = {}
    for status in route.statuses(api_key):
        if status == 200:
            ok: dict = {"description": "OK"}
            if route.media_type is not None:
                ok["content"] = {route.media_type: {"schema": route.answer or {"type": "string"}}}
            out["200"] = ok
            continue
        answer = {"description": STATUSES[status][1],
                  "content": {"application/json": {"schema": error_schema(route.path, status)}}}
        if status == 405:
            answer["headers"] = {"Allow": {"description": "the methods the route takes", "schema": {"type": "string"}}}
        out[str(status)] = answer
    return out


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def describe(routes: Iterable[Route], *, kind: str, limits: Dict[str, Any], api_key: bool, model_id: str,
             version: str, outputs: frozenset = frozenset()) -> dict:
    """The OpenAPI document of the routes a server of a `kind` model (giving `outputs`) answers."""
    routes = list(routes)
    paths: Dict[str, dict] = {}
    for r in routes:
        if not r.answers(kind, outputs):
            continue
        op: dict = {"summary": r.summary, "operationId": r.handler, "responses": _responses(r, api_key)}
        if r.models is not None:
            op["description"] = f"Served by {' or '.join(_a(m) for m in r.models)} model only."
        if r.output == "sparse":
            op["description"] = "Served by an embedding model that gives sparse vectors (BGE-M3's head, SPLADE) only."
        if r.body:
            op["requestBody"] = {"required": True,
                                 "content": {"application/json": {"schema": body_schema(r.body, limits)}}}
        if api_key and r.open:
            op["security"] = []
        paths.setdefault(r.path, {})[r.method.lower()] = op
    others = sorted({r.path for r in routes if not r.answers(kind, outputs)})
    text = (f"{model_id}: {_a(kind)} model. Errors are text-embeddings-inference's {{\"error\", \"error_type\"}} "
            "(OpenAI's {\"error\": {\"message\", \"type\", \"code\"}} on /v1/); a path not listed here answers 404")
    if others:
        text += f", among them the routes of other kinds of model ({', '.join(others)})"
    doc = {"openapi": "3.1.0",
           "info": {"title": "fastbert serve", "version": version, "description": text + "."},
           "paths": paths}
    if api_key:
        doc["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        doc["security"] = [{"bearer": []}]
    return doc


# ---- the page at /docs

def _type(schema: dict) -> str:
    """A short reading of a JSON Schema: string | array of string (1..32 items)."""
    if "oneOf" in schema:
        return " | ".join(_type(s) for s in schema["oneOf"])
    if "enum" in schema:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        items = schema.get("items", {})
        inner = _type(items)
        inner = f"({inner})" if "|" in inner else inner
        lo, hi = schema.get("minItems"), schema.get("maxItems")
        count = f" ({lo}..{hi} items)" if lo is not None and hi is not None else ""
        return f"array of {inner}{count}"
    if kind == "integer" and "minimum" in schema and "maximum" in schema:
        return f"integer {schema['minimum']}..{schema['maximum']}"
    return str(kind)


def _body_rows(schema: dict) -> str:
    required = set(schema.get("required", ()))
    rows = []
    for name, prop in schema["properties"].items():
        default = "required" if name in required else f"default {json.dumps(prop.get('default'), ensure_ascii=False)}"
        rows.append(f"<tr><td><code>{html.escape(name)}</code></td><td><code>{html.escape(_type(prop))}</code></td>"
                    f"<td>{html.escape(default)}</td><td>{html.escape(prop.get('description', ''))}</td></tr>")
    return "<table><tr><th>field</th><th>type</th><th></th><th></th></tr>" + "".join(rows) + "</table>"


def docs_page(doc: dict) -> str:
    """The document as a page: each route, its body's fields and its answers."""
    info = doc["info"]
    parts = [f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(info['title'])}"
             "</title><style>body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
             "code{background:#f4f4f4}</style></head><body>",
             f"<h1>{html.escape(info['title'])} {html.escape(info['version'])}</h1>",
             f"<p>{html.escape(info['description'])}</p>",
             "<p>The OpenAPI description of these routes (for clients and tools): "
             "<a href=\"/openapi.json\"><code>GET /openapi.json</code></a>.</p>"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            parts.append(f"<h2><code>{method.upper()} {html.escape(path)}</code></h2><p>{html.escape(op['summary'])}."
                         + (f" {html.escape(op['description'])}" if "description" in op else "") + "</p>")
            if "requestBody" in op:
                parts.append(_body_rows(op["requestBody"]["content"]["application/json"]["schema"]))
            answers = "".join(f"<li><b>{status}</b> {html.escape(r['description'])}</li>"
                              for status, r in op["responses"].items())
            parts.append(f"<ul>{answers}</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
