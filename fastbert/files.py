"""The JSON files a job keeps beside its outputs (a manifest, a checkpoint index): read when they
are there, and written whole or not at all, so that a run killed while writing one leaves the old
file or the new one, never a mix."""
import json
import os
from typing import Any


def read_json(path: str) -> Any:
    """The JSON value in `path`; None when there is no such file. OSError or ValueError (the caller
    says what the file is) when it cannot be read or is not JSON."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, value: Any, *, indent: int = 2) -> None:
    """`value` as JSON into `path`: written to a temporary file, flushed to disk, then renamed over
    `path`."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=indent, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
