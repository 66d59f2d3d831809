"""The corpus `fastbert pretrain` uses when none is given: English prose found on every machine that
has Python, the documentation text of the standard library's `pydoc_data.topics` (the pages that
`help("if")` prints: the language reference, the built-in types).

Every section of a page (a heading underlined with = * - ~ ^) is one document; the prose
paragraphs of a section are split into sentences. Indented blocks (code, grammar rules), tables
and headings are left out, as are sections with no prose.
"""
from __future__ import annotations

import re
from typing import Iterator, List

from fastbert.data.corpus import clean_line, split_sentences

_UNDERLINE = re.compile(r"([=*\-~^#])\1{2,}")
_BULLET = re.compile(r"^(\*|-|\d+\.)\s+")


def available() -> bool:
    try:
        import pydoc_data.topics  # noqa: F401
    except ImportError:
        return False
    return True


def _sections(text: str) -> Iterator[List[str]]:
    """The paragraphs (lists of lines) of each section of one page."""
    lines = text.split("\n")
    section: List[List[str]] = []
    para: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and _UNDERLINE.fullmatch(nxt.strip()) and not line.startswith(" "):
            if para:
                section.append(para)
                para = []
            if section:
                yield section
            section = []
            i += 2
            continue
        if not line.strip():
            if para:
                section.append(para)
                para = []
        else:
            para.append(line)
        i += 1
    if para:
        section.append(para)
    if section:
        yield section


def _is_prose(para: List[str]) -> bool:
    first = para[0]
    if first.startswith(" "):  # code, grammar, quoted blocks
        return False
    if first.lstrip().startswith(("+--", "|", "===", ">>>")):
        return False
    words = " ".join(para).split()
    letters = sum(w.isalpha() for w in words)
    return len(words) >= 4 and letters >= 0.5 * len(words)


def documents() -> Iterator[List[str]]:
    """The documents (lists of sentences) of pydoc_data.topics, in a fixed order."""
    try:
        from pydoc_data.topics import topics
    except ImportError as e:
        raise RuntimeError(
            "fastbert pretrain: the default corpus is the standard library's pydoc_data.topics, which this "
            "Python lacks (some distributions ship it separately); pass a corpus with --corpus FILE"
        ) from e
    for name in sorted(topics):
        for section in _sections(topics[name]):
            sentences: List[str] = []
            for para in section:
                if not _is_prose(para):
                    continue
                text = " ".join(clean_line(_BULLET.sub("", ln.strip())) for ln in para)
                sentences.extend(s for s in split_sentences(text) if len(s.split()) >= 2)
            if sentences:
                yield sentences
