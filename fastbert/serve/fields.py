"""The fields of the server's request bodies: one table per route that both checks a body and
describes it (its JSON Schema, for the OpenAPI document of fastbert.serve.openapi), so that what the
server takes and what it says it takes are the same list.

A field is a name, the kind of value it takes, its default (REQUIRED: none) and what it means. A
body is checked field by field in the table's order; the first wrong one is refused with
text-embeddings-inference's message (`normalize` must be bool, ...). A null is the default of a
field whose default is None, and wrong elsewhere. Fields the table does not name are ignored, as
text-embeddings-inference and OpenAI ignore them.

Some bounds belong to the served model and the server's settings (the inputs one request may hold,
the embedding's width, the model's prompts): `limits` names them, {"max_client_batch_size": 32,
"dim": 384, "prompts": ["query", "passage"]}. A kind may describe more than it checks: a prompt_name
is checked as a string here and against the model's prompts by the model (answered 413, as
text-embeddings-inference answers it), and described as one of the model's prompts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence

REQUIRED = object()


class FieldError(ValueError):
    """A body that is not what the route takes (answered 422, a one-line message)."""


@dataclass(frozen=True)
class Kind:
    """A kind of value: what it is called in messages, whether a value is one, its JSON Schema.

    schema(limits) -> the JSON Schema; extra(name, value, limits) -> a message when a value of the
    right type is still out of bounds (an enum, a range), else None; cast(value) -> the value the
    route gets (None: the value as sent)."""

    what: str
    accepts: Callable[[Any], bool]
    schema: Callable[[Dict[str, Any]], dict]
    extra: Optional[Callable[[str, Any, Dict[str, Any]], Optional[str]]] = None
    cast: Optional[Callable[[Any], Any]] = None


def _is_text(value) -> bool:
    return isinstance(value, str)


def _is_texts(value) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(t, str) for t in value))


def _is_pair(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(t, str) for t in value)


def _is_predict_inputs(value) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) or _is_pair(v) for v in value))


def _texts_schema(limits: Dict[str, Any]) -> dict:
    return {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                           "maxItems": limits["max_client_batch_size"]}]}


_PAIR = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}


def _predict_schema(limits: Dict[str, Any]) -> dict:
    many = {"minItems": 1, "maxItems": limits["max_client_batch_size"]}
    return {"anyOf": [{"type": "string"}, _PAIR, {"type": "array", "items": {"type": "string"}, **many},
                      {"type": "array", "items": _PAIR, **many}]}


def _mixed(name, value, limits) -> Optional[str]:
    if isinstance(value, list) and not _is_pair(value) and len({isinstance(v, str) for v in value}) > 1:
        return f"`{name}` must be all texts or all pairs of texts"
    return None


def one_of(*choices: str) -> Kind:
    """A string among `choices`."""
    def extra(name, value, limits):
        if value not in choices:
            return f"`{name}` must be {' or '.join(choices)}, got {value!r}"
        return None
    return Kind("a string", _is_text, lambda limits: {"type": "string", "enum": list(choices)}, extra)


def _is_integer(value) -> bool:
    """JSON Schema's integer: a number without a fractional part, 46.0 as well as 46 (not a bool)."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def int_up_to(limit: str) -> Kind:
    """An integer in 1..limits[limit]."""
    def extra(name, value, limits):
        if not 1 <= value <= limits[limit]:
            return f"`{name}` must be in 1..{limits[limit]}, got {value}"
        return None
    return Kind("int", _is_integer, lambda limits: {"type": "integer", "minimum": 1, "maximum": limits[limit]}, extra,
                cast=int)


STRING = Kind("a string", _is_text, lambda limits: {"type": "string"})
PROMPT = Kind("a string", _is_text, lambda limits: {"type": "string", "enum": list(limits["prompts"])})
BOOL = Kind("bool", lambda v: isinstance(v, bool), lambda limits: {"type": "boolean"})
TEXTS = Kind("a string or a list of strings", _is_texts, _texts_schema)
PREDICT_INPUTS = Kind("a text, a pair of texts, or a list of texts or of pairs", _is_predict_inputs, _predict_schema,
                      _mixed)


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    default: Any = REQUIRED
    doc: str = ""
    examples: Sequence[Any] = field(default_factory=tuple)

    def message(self) -> str:
        return f"`{self.name}` must be {self.kind.what}"

    def schema(self, limits: Dict[str, Any]) -> dict:
        out = dict(self.kind.schema(limits))
        if self.default is None and "enum" in out:  # null is the default: the value may be null
            out = {"enum": [*out["enum"], None]}
        elif self.default is None:
            out = {"oneOf": [out, {"type": "null"}]}
        if self.default is not REQUIRED:
            out["default"] = self.default
        if self.doc:
            out["description"] = self.doc
        if self.examples:
            out["examples"] = list(self.examples)
        return out


def read(body: dict, fields: Sequence[Field], limits: Dict[str, Any]) -> Dict[str, Any]:
    """{name: value} of every field of `fields` in `body` (a JSON object), defaults filled in;
    FieldError with the first wrong field's message."""
    out = {}
    for f in fields:
        value = body.get(f.name, None if f.default is REQUIRED else f.default)
        if value is None and f.default is None:
            out[f.name] = None
            continue
        if not f.kind.accepts(value):
            raise FieldError(f.message())
        problem = f.kind.extra(f.name, value, limits) if f.kind.extra else None
        if problem:
            raise FieldError(problem)
        out[f.name] = f.kind.cast(value) if f.kind.cast else value
    return out


def body_schema(fields: Sequence[Field], limits: Dict[str, Any]) -> dict:
    """The JSON Schema of a body of these fields."""
    schema = {"type": "object", "properties": {f.name: f.schema(limits) for f in fields}}
    required = [f.name for f in fields if f.default is REQUIRED]
    if required:
        schema["required"] = required
    return schema
