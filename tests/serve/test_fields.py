"""The request fields' one table: what `read` takes is what the JSON Schema describes (everything
the description calls valid is read; what read takes beyond it is refused later with its own
status: an empty list 400, too many inputs or an unknown prompt name 413), defaults and nulls, the
first wrong field's message, and the integers JSON Schema counts (46.0 is an integer)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastbert.serve import app as serve_app
from fastbert.serve.fields import BOOL, PREDICT_INPUTS, PROMPT, TEXTS, Field, FieldError, int_up_to, read

jsonschema_rs = pytest.importorskip("jsonschema_rs", reason="schemathesis's JSON Schema validator (the test extra)")

LIMITS = {"max_client_batch_size": 3, "dim": 8, "prompts": ["query"]}
BODIES = {"embed": serve_app.EMBED_BODY, "openai": serve_app.OPENAI_BODY, "rerank": serve_app.RERANK_BODY,
          "predict": serve_app.PREDICT_BODY, "tokenize": serve_app.TOKENIZE_BODY}
FIELDS = {}  # each field once (the bodies share some): "name@body" -> Field
for _body, _fields in BODIES.items():
    for _f in _fields:
        if all(_f is not g for g in FIELDS.values()):
            FIELDS[f"{_f.name}@{_body}"] = _f
TEXT = st.text(alphabet=st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3) | st.characters(), max_size=5)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 20) | st.floats(-5, 20, allow_nan=False) | TEXT
                    | st.sampled_from(["query", "float", "base64"]),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=2), max_leaves=8)


def _refused_later(f: Field, value) -> bool:
    """Values read takes and the app or the model refuses with 400 or 413 (not 422)."""
    if f.kind in (TEXTS, PREDICT_INPUTS) and isinstance(value, list):
        single_pair = f.kind is PREDICT_INPUTS and len(value) == 2 and all(isinstance(v, str) for v in value)
        return not single_pair and not 1 <= len(value) <= LIMITS["max_client_batch_size"]
    return f.kind is PROMPT and isinstance(value, str)


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_read_takes_what_the_schema_describes(key):
    f = FIELDS[key]
    validator = jsonschema_rs.validator_for(f.schema(LIMITS))

    @settings(max_examples=80, derandomize=True, deadline=None, database=None)
    @given(JSON)
    def check(value):
        described = validator.is_valid(value)
        try:
            read({f.name: value}, [f], LIMITS)
            taken = True
        except FieldError:
            taken = False
        assert described == taken or (taken and _refused_later(f, value)), (value, described, taken)

    check()


def test_defaults_nulls_and_the_first_wrong_fields_message():
    fields = serve_app.EMBED_BODY
    assert read({"inputs": "안녕"}, fields, LIMITS) == {"inputs": "안녕", "normalize": True, "truncate": False,
                                                      "prompt_name": None}
    assert read({"inputs": "x", "prompt_name": None, "extra": 1}, fields, LIMITS)["prompt_name"] is None
    for body, message in [({}, "`inputs` must be a string or a list of strings"),
                          ({"inputs": "x", "normalize": None}, "`normalize` must be bool"),
                          ({"inputs": [1], "normalize": "yes"}, "`inputs` must be a string or a list of strings")]:
        with pytest.raises(FieldError, match=f"^{message}$"):
            read(body, fields, LIMITS)


def test_an_integer_is_what_json_schema_calls_one():
    """`dimensions: 4.0` was refused (`must be int`) though the description's integer takes it."""
    dims = Field("dimensions", int_up_to("dim"), None)
    got = read({"dimensions": 4.0}, [dims], LIMITS)["dimensions"]
    assert got == 4 and type(got) is int
    for value, message in [(4.5, "must be int"), (True, "must be int"), (9, r"must be in 1\.\.8, got 9"),
                           (0.0, r"must be in 1\.\.8, got 0\.0")]:
        with pytest.raises(FieldError, match=message):
            read({"dimensions": value}, [dims], LIMITS)


def test_predict_inputs_are_all_texts_or_all_pairs():
    inputs = Field("inputs", PREDICT_INPUTS)
    assert read({"inputs": ["a", "b"]}, [inputs], LIMITS)["inputs"] == ["a", "b"]  # one pair
    assert read({"inputs": [["a", "b"], ["c", "d"]]}, [inputs], LIMITS)
    with pytest.raises(FieldError, match="^`inputs` must be all texts or all pairs of texts$"):
        read({"inputs": [["a", "b"], "c"]}, [inputs], LIMITS)
    assert not jsonschema_rs.validator_for(inputs.schema(LIMITS)).is_valid([["a", "b"], "c"])


def test_a_null_default_with_an_enum_is_one_of_its_values_or_null():
    prompt = Field("prompt_name", PROMPT, None)
    assert prompt.schema(LIMITS)["enum"] == ["query", None]
    assert prompt.schema({**LIMITS, "prompts": []})["enum"] == [None]  # a model without prompts takes only null
    assert Field("normalize", BOOL, True).schema(LIMITS) == {"type": "boolean", "default": True}
