"""Streaming readers of a corpus to embed: text files (one text per line), JSON Lines and Parquet,
record by record, never a whole file in memory.

Every record has an id and a text: the --id-field's value (JSON Lines, Parquet), else the
record's position in the whole input (0, 1, 2, ... across the files in the order given), so the
ids of a run are stable. A record that cannot be embedded (an undecodable line, a line that is not
JSON, a missing field, a text that is not a string, an empty text) is an error naming the file and
the line (or row); with on_error="skip" it is skipped and counted instead.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

FORMATS = ("text", "jsonl", "parquet")


class CorpusError(ValueError):
    """A record that cannot be embedded (names the file and line or row)."""


@dataclass
class Record:
    id: object
    text: str
    position: int  # in the whole input, every record counted (bad ones too)


@dataclass
class Skipped:
    """Records skipped with on_error="skip", by reason."""

    reasons: Dict[str, int] = field(default_factory=dict)
    examples: List[str] = field(default_factory=list)
    last: Optional[tuple] = None

    def add(self, reason: str, where: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {reason}")
        self.last = (reason, where)

    def as_dict(self) -> dict:
        return {"total": self.total, "reasons": dict(self.reasons), "examples": list(self.examples)}

    @property
    def total(self) -> int:
        return sum(self.reasons.values())


def file_format(path: str) -> str:
    name = path.lower()
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    if name.endswith(".jsonl") or name.endswith(".ndjson") or name.endswith(".json"):
        return "jsonl"
    return "text"


def check_inputs(paths: Sequence[str]) -> None:
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"input file {path} does not exist")
        if os.path.isdir(path):
            raise CorpusError(f"input {path} is a directory; give its files")
        if not os.access(path, os.R_OK):
            raise CorpusError(f"input file {path} is not readable")


def count_records(paths: Sequence[str]) -> int:
    """The records the inputs hold (lines of text and JSON Lines files, rows of Parquet files; blank
    lines of JSON Lines files not counted), for the progress bar's total."""
    total = 0
    for path in paths:
        if file_format(path) == "parquet":
            import pyarrow.parquet as pq

            total += pq.ParquetFile(path).metadata.num_rows
            continue
        with open(path, "rb") as f:
            last = b"\n"
            for block in iter(lambda: f.read(1 << 20), b""):
                total += block.count(b"\n")
                last = block[-1:]
            total += last != b"\n"
    return total


def _text(value, where: str, skipped: Optional[Skipped]) -> Optional[str]:
    reason = None
    if not isinstance(value, str):
        reason = f"the text is {type(value).__name__}, not a string" if value is not None else "the text is missing"
    elif not value.strip():
        reason = "the text is empty"
    if reason is None:
        return value
    if skipped is None:
        raise CorpusError(f"{where}: {reason} (--on-error skip skips such records)")
    skipped.add(reason, where)
    return None


def _lines(path: str) -> Iterator[tuple]:
    """(line number from 1, the line without its end or None when it is not UTF-8)."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                yield n, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield n, None


def _read_text(path: str, skipped: Optional[Skipped]) -> Iterator[Optional[str]]:
    for n, line in _lines(path):
        where = f"{path} line {n}"
        if line is None:
            if skipped is None:
                raise CorpusError(f"{where}: not UTF-8 text (--on-error skip skips such records)")
            skipped.add("not UTF-8 text", where)
            yield None
            continue
        yield _text(line, where, skipped)


def _read_jsonl(path: str, text_field: str, id_field: Optional[str], skipped: Optional[Skipped]) -> Iterator:
    for n, line in _lines(path):
        where = f"{path} line {n}"
        if line is not None and not line.strip():
            continue  # a blank line is no record
        try:
            obj = json.loads(line) if line is not None else None
        except json.JSONDecodeError as e:
            obj, line = None, None
            error = f"not JSON ({e.msg})"
        else:
            error = "not UTF-8 text" if line is None else None
        if error is None and not isinstance(obj, dict):
            error = "not a JSON object"
        if error is None and (text_field not in obj or (id_field is not None and id_field not in obj)):
            missing = text_field if text_field not in obj else id_field
            error = f"no field {missing!r} (fields: {', '.join(map(repr, list(obj)[:8]))})"
        if error is not None:
            if skipped is None:
                raise CorpusError(f"{where}: {error} (--on-error skip skips such records)")
            skipped.add(error.split(" (")[0], where)
            yield None
            continue
        text = _text(obj[text_field], where, skipped)
        yield None if text is None else (obj[id_field] if id_field is not None else None, text)


def _read_parquet(path: str, text_field: str, id_field: Optional[str], skipped: Optional[Skipped]) -> Iterator:
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors for a damaged or foreign file
        raise CorpusError(f"{path}: not a readable Parquet file ({e})") from None
    names = f.schema_arrow.names
    for column in (text_field, id_field):
        if column is not None and column not in names:
            raise CorpusError(f"{path}: no column {column!r} (columns: {', '.join(map(repr, names))})")
    columns = [text_field] + ([id_field] if id_field is not None else [])
    row = 0
    for batch in f.iter_batches(batch_size=8192, columns=columns):
        texts = batch.column(0).to_pylist()
        ids = batch.column(1).to_pylist() if id_field is not None else [None] * len(texts)
        for i, (t, ident) in enumerate(zip(texts, ids)):
            text = _text(t, f"{path} row {row + i}", skipped)
            yield None if text is None else (ident, text)
        row += len(texts)


def read_records(paths: Sequence[str], *, text_field: str = "text", id_field: Optional[str] = None,
                 skipped: Optional[Skipped] = None, start: int = 0) -> Iterator[Record]:
    """The records of `paths` in order, from position `start` (the records before it are read and
    dropped, bad ones included, so positions, and the ids made of them, are those of a run from the
    start). skipped=None: a bad record is a CorpusError; else it is counted there (from `start` on)
    and left out."""
    position = 0
    seen = Skipped() if skipped is not None else None
    for path in paths:
        fmt = file_format(path)
        if fmt == "text":
            if id_field is not None:
                raise CorpusError(f"{path}: a text file has no fields; --id-field applies to JSON Lines and Parquet")
            items = ((None, t) if t is not None else None for t in _read_text(path, seen))
        elif fmt == "jsonl":
            items = _read_jsonl(path, text_field, id_field, seen)
        else:
            items = _read_parquet(path, text_field, id_field, seen)
        for item in items:
            if position >= start:
                if item is not None:
                    ident, text = item
                    yield Record(position if ident is None else ident, text, position)
                else:
                    skipped.add(*seen.last)
            position += 1
