"""What every benchmark prints and writes: the command and machine lines above its table, the JSON
of its rows, and matplotlib for its plot (optional: a missing matplotlib skips the plot)."""
from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

from fastbert.bench.timing import machine_info


def command_line(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> str:
    """The command that produced a table, as a user would type it."""
    if argv is None:
        return " ".join(["python", os.path.relpath(sys.argv[0])] + sys.argv[1:])
    return " ".join([prog or "python"] + list(argv))


def header(command: str, **extra) -> dict:
    """Print '# command' and '# {machine info}' (CPU model and flags, versions, threads); returns the info."""
    info = dict(machine_info(), **extra)
    print(f"# {command}")
    print(f"# {json.dumps(info)}")
    return info


def write_json(path: str, command: str, info: dict, rows, **extra) -> None:
    """{"command", "machine", "rows", ...extra} as JSON at `path` (its directory made)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"command": command, "machine": info, **extra, "rows": rows}, f, indent=1)


def pyplot(quiet: bool = False, what: str = "no plot written"):
    """matplotlib.pyplot on the Agg backend, or None (saying so on stderr unless quiet) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not quiet:
            print(f"matplotlib is not installed: {what} (pip install matplotlib)", file=sys.stderr)
        return None
    return plt
