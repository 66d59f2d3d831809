"""Schemathesis hooks of the server's fuzz test (loaded by `st run` through SCHEMATHESIS_HOOKS):
Hangul in the texts of the bodies it generates.

Schemathesis draws strings from all of Unicode, where Hangul is a sliver; Korean is a first-class
input here. So half the bodies it generates have each text of their text fields (inputs, input,
texts, query) replaced by Hangul: syllables, conjoining and compatibility jamo, half-width jamo,
mixed with spaces, Latin, digits and emoji, up to a length over the models' 256 tokens. A text
field takes any string, so a body stays as valid (or as invalid) as it was."""
import schemathesis
from hypothesis import strategies as st

TEXT_FIELDS = ("inputs", "input", "texts", "query")

HANGUL = st.one_of(
    st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3),  # syllables: 가 ... 힣
    st.characters(min_codepoint=0x1100, max_codepoint=0x11FF),  # conjoining jamo
    st.characters(min_codepoint=0x3130, max_codepoint=0x318F),  # compatibility jamo
    st.characters(min_codepoint=0xFFA0, max_codepoint=0xFFDC),  # half-width jamo
    st.sampled_from(list(" .,?!\n\t안녕하세요세계한국어문장abcXYZ019😀\u200b\u0301")),
)
KOREAN = st.text(alphabet=HANGUL, max_size=600)


def _korean(value):
    """A strategy of `value` with each string in it (at any depth of lists) drawn from KOREAN."""
    if isinstance(value, str):
        return KOREAN
    if isinstance(value, list):
        return st.tuples(*map(_korean, value)).map(list)
    return st.just(value)


@schemathesis.hook
def flatmap_body(context, body):
    if not isinstance(body, dict) or not any(k in body for k in TEXT_FIELDS):
        return st.just(body)
    korean = st.fixed_dictionaries({k: _korean(v) if k in TEXT_FIELDS else st.just(v) for k, v in body.items()})
    return st.one_of(st.just(body), korean)
