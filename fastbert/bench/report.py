"""What every benchmark prints and writes: the command and machine lines above its table, the JSON
of its rows, and matplotlib for its plot (optional: a missing matplotlib skips the plot); and the
command-line options and progress bar they share."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, List, Optional

import torch

from fastbert.bench.timing import machine_info


def parser(doc: str, prog: Optional[str] = None, parser_class=argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A benchmark's argument parser, its module docstring as the description; a `fastbert` command
    (`fastbert bench`) passes its own parser_class, whose usage errors are one line."""
    return parser_class(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_device_options(ap: argparse.ArgumentParser, budget: float) -> None:
    """--device (CUDA when there is one) and --budget (seconds of timing per measurement)."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", type=float, default=budget, help="seconds of timing per measurement at most")


def add_output_options(ap: argparse.ArgumentParser, json_help: Optional[str] = "write the rows as JSON here",
                       png_help: Optional[str] = None, png: bool = True) -> None:
    """--json PATH, and --png PATH unless png is False."""
    ap.add_argument("--json", default=None, help=json_help)
    if png:
        ap.add_argument("--png", default=None, help=png_help)


def finish(rows, print_rows: Callable, argv: Optional[List[str]] = None, prog: Optional[str] = None,
           json_path: Optional[str] = None, png_path: Optional[str] = None, plot: Optional[Callable] = None,
           **json_extra) -> None:
    """After the timing: the command and machine lines, the table (print_rows(rows)), then the JSON
    (with json_extra) and the plot (plot(rows, png_path)) where asked for."""
    command = command_line(argv, prog)
    info = header(command)
    print_rows(rows)
    if json_path:
        write_json(json_path, command, info, rows, **json_extra)
    if png_path and plot is not None:
        plot(rows, png_path)


def progress_bar(it, **kw):
    """tqdm on stderr over `it` (its keywords: desc, unit, disable...), or `it` itself without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency; keep working without it
        return it
    return tqdm(it, file=sys.stderr, **kw)


def command_line(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> str:
    """The command that produced a table, as a user would type it."""
    if argv is None:
        return " ".join(["python", os.path.relpath(sys.argv[0])] + sys.argv[1:])
    return " ".join([prog or "python"] + list(argv))


def without_slow_bf16(dtypes: List, names=("bf16", "bfloat16", "torch.bfloat16")) -> List:
    """`dtypes` less bf16 on a CPU without native bf16 (no AVX512_BF16 / AMX, or a kernel level capped
    below avx512), saying why once: its bf16 products run no faster than fp32 there (fastbert runs them
    in fp32; torch's are several times slower: benchmarks/LOG.md, "bf16 on a CPU without native
    bf16"), so a bf16 figure would measure the CPU's lack of it."""
    import fastbert.backend

    if fastbert.backend.native_bf16() is not False:
        return list(dtypes)
    kept = [d for d in dtypes if str(d) not in names]
    if len(kept) < len(dtypes):
        print(f"# bf16 skipped: no native bf16 here (AVX512_BF16 or AMX, with fastbert's kernels at level "
              f"{fastbert.backend.cpu_capability()}), so bf16 would run no faster than fp32")
    return kept


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


def save_figure(fig, path: str, dpi: int = 120) -> None:
    """Lay out, write `path` and say so."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    print(f"wrote {path}")
