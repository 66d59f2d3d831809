"""Reading text corpora into documents of sentences, every skipped line counted.

Two layouts are read (`fmt`):

  "lines"       one sentence per line, a blank line between documents: the input format of
                Google's create_pretraining_data.py.
  "paragraphs"  running text: consecutive non-blank lines form a paragraph (hard-wrapped text is
                joined back), a paragraph is split into sentences, one blank line separates
                paragraphs of a document and two or more blank lines separate documents.
  "auto"        per file: "lines" when most lines end a sentence and hold at most one, else
                "paragraphs".

A file always ends its last document. Nothing in a corpus makes reading fail: an undecodable line
(not UTF-8), a line left empty once control characters are removed, and a binary file (NUL bytes in
its first 8 KiB) are skipped and counted in CorpusStats. Only a path that does not exist, or a
corpus with no text at all, is an error (raised by the caller that needs text).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Sequence

FORMATS = ("auto", "lines", "paragraphs")

_SNIFF_BYTES = 8192
_SNIFF_LINES = 200


@dataclass
class CorpusStats:
    files: int = 0
    bytes: int = 0
    lines: int = 0  # every line read, blank ones included
    documents: int = 0
    sentences: int = 0
    undecodable_lines: int = 0
    empty_lines: int = 0  # lines with content that cleaning left empty (control characters only)
    binary_files: List[str] = field(default_factory=list)
    empty_files: List[str] = field(default_factory=list)
    formats: dict = field(default_factory=dict)  # path -> the format it was read as

    @property
    def skipped_lines(self) -> int:
        return self.undecodable_lines + self.empty_lines

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "lines": self.lines,
            "documents": self.documents,
            "sentences": self.sentences,
            "skipped_undecodable_lines": self.undecodable_lines,
            "skipped_empty_lines": self.empty_lines,
            "skipped_binary_files": list(self.binary_files),
            "empty_files": list(self.empty_files),
        }


# --------------------------------------------------------------------------------------------
# cleaning and sentence splitting

# control characters (Unicode category Cc, tab and newlines aside), the BOM and the replacement character
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff\ufffd]")


def clean_line(text: str) -> str:
    """Drop control characters (tabs become spaces), collapse runs of whitespace, strip."""
    return " ".join(_CONTROL.sub("", text).split())


# a sentence ends at . ! ? (maybe followed by closing quotes / brackets), then whitespace, then
# something that can start a sentence (maybe after an opening quote or bracket)
_BOUNDARY = re.compile(r"([.!?]+[\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_ABBREVIATIONS = {
    "e.g", "i.e", "etc", "cf", "vs", "mr", "mrs", "ms", "dr", "prof", "st", "no", "fig", "eq", "vol", "al",
    "jr", "sr", "approx", "dept", "inc", "ltd", "co", "corp", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
    "sep", "sept", "oct", "nov", "dec", "sec", "ch", "p", "pp", "ed", "eds", "op",
}


def split_sentences(paragraph: str) -> List[str]:
    """Split running text into sentences at . ! ? followed by a capital letter or a digit, keeping
    common abbreviations ("e.g.", "Dr.") and single initials ("J. Smith") inside a sentence."""
    paragraph = paragraph.strip()
    if not paragraph:
        return []
    out: List[str] = []
    start = 0
    for m in _BOUNDARY.finditer(paragraph):
        end = m.end(1)
        if m.group(1).startswith(".") and len(m.group(1)) == 1:
            word = paragraph[start:m.start(1)].rsplit(None, 1)[-1] if paragraph[start:m.start(1)].strip() else ""
            word = word.lstrip("\"'(\u201c\u2018[").lower()
            if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                continue
        piece = paragraph[start:end].strip()
        if piece:
            out.append(piece)
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return out


# --------------------------------------------------------------------------------------------
# files


def is_binary(path: str) -> bool:
    """True when the first 8 KiB of the file hold a NUL byte (what no text encoding read here has)."""
    with open(path, "rb") as f:
        return b"\x00" in f.read(_SNIFF_BYTES)


def _decoded_lines(path: str, stats: CorpusStats) -> Iterator[str]:
    """The file's lines, decoded as UTF-8 (a BOM is dropped); undecodable lines are counted and
    skipped; a line whose content is only control characters is counted and skipped."""
    with open(path, "rb") as f:
        for raw in f:
            stats.lines += 1
            stats.bytes += len(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                stats.undecodable_lines += 1
                continue
            if "\x00" in text:
                stats.undecodable_lines += 1
                continue
            stripped = text.strip()
            if not stripped:
                yield ""
                continue
            line = clean_line(stripped)
            if not line:
                stats.empty_lines += 1
                continue
            yield line


def sniff_format(path: str) -> str:
    """"lines" when at least 60% of the first non-blank lines end a sentence and at most 10% of them
    hold a sentence boundary inside; "paragraphs" otherwise."""
    ends = inner = n = 0
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            n += 1
            ends += bool(re.search(r"[.!?][\"'\u201d\u2019)\]]*$", line))
            inner += len(split_sentences(line)) > 1
            if n >= _SNIFF_LINES:
                break
    if n == 0:
        return "lines"
    return "lines" if ends >= 0.6 * n and inner <= 0.1 * n else "paragraphs"


def _documents_from_lines(lines: Iterable[str], stats: CorpusStats) -> Iterator[List[str]]:
    doc: List[str] = []
    for line in lines:
        if line:
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _documents_from_paragraphs(lines: Iterable[str], stats: CorpusStats) -> Iterator[List[str]]:
    doc: List[str] = []
    para: List[str] = []
    blanks = 0
    for line in lines:
        if line:
            if blanks >= 2 and doc:
                yield doc
                doc = []
            blanks = 0
            para.append(line)
            continue
        blanks += 1
        if para:
            doc.extend(split_sentences(" ".join(para)))
            para = []
    if para:
        doc.extend(split_sentences(" ".join(para)))
    if doc:
        yield doc


def read_documents(paths: Sequence[str], fmt: str = "auto", stats: CorpusStats | None = None) -> Iterator[List[str]]:
    """Documents (lists of sentences) of the text files `paths`, in order, streamed.

    Directories are read recursively (files in sorted order). Binary files are skipped and named in
    stats.binary_files. Raises FileNotFoundError for a path that does not exist."""
    if fmt not in FORMATS:
        raise ValueError(f"fastbert prepare: unknown corpus format {fmt!r}; choose one of {FORMATS}")
    stats = CorpusStats() if stats is None else stats
    for path in expand_paths(paths):
        stats.files += 1
        if os.path.getsize(path) == 0:
            stats.empty_files.append(path)
            continue
        if is_binary(path):
            stats.binary_files.append(path)
            continue
        file_fmt = sniff_format(path) if fmt == "auto" else fmt
        stats.formats[path] = file_fmt
        reader = _documents_from_lines if file_fmt == "lines" else _documents_from_paragraphs
        for doc in reader(_decoded_lines(path, stats), stats):
            stats.documents += 1
            stats.sentences += len(doc)
            yield doc


def expand_paths(paths: Sequence[str]) -> List[str]:
    """Files named, and the files under directories named (sorted); a missing path is an error."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: List[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                out.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith("."))
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"fastbert prepare: corpus path {p} does not exist")
    return out


def write_documents(documents: Iterable[Sequence[str]], path: str) -> int:
    """Write documents in the "lines" layout (one sentence per line, a blank line between
    documents); returns the number written."""
    n = 0
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in documents:
            if not doc:
                continue
            if n:
                f.write("\n")
            for s in doc:
                f.write(s.replace("\n", " ").strip() + "\n")
            n += 1
    os.replace(tmp, path)
    return n
