"""The `fastbert` command (the console entry point): it finds the command and runs it.

The commands are fastbert.commands' modules, each imported only when it runs; every error a
command reports is one line on stderr and a non-zero exit (fastbert.commands says which).
"""
from __future__ import annotations

import os
import sys

from fastbert.commands import COMMANDS, PROG, message, report

__all__ = ["COMMANDS", "PROG", "main", "message", "report"]


def _usage(out) -> None:
    width = max(map(len, COMMANDS)) + 2
    print(f"usage: {PROG} COMMAND [options]\n\ncommands:", file=out)
    for name, (_, text) in COMMANDS.items():
        print(f"  {name:<{width}}{text}", file=out)


def main(argv=None) -> int:
    """Run a subcommand; its errors are one line on stderr (see fastbert.commands)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _usage(sys.stdout)
        return 0
    if argv[0] not in COMMANDS:
        report(PROG, f"unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)}; `{PROG} --help` describes them)")
        return 2
    import importlib

    name = argv[0]
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(argv[1:]) or 0)
    except KeyboardInterrupt:
        print(f"{PROG} {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command line reports, the traceback is opt-in
        if os.environ.get("FASTBERT_DEBUG") == "1":
            raise
        report(f"{PROG} {name}", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
