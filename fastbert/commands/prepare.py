"""`fastbert prepare`: text files -> vocabulary -> pretraining data on disk (fastbert.data.prepare says
what is written)."""
from __future__ import annotations

import argparse

from fastbert.commands import CommandParser, report
from fastbert.data.prepare import PrepareError, add_data_arguments, format_summary, prepare_from_args


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="fastbert prepare",
        description="Turn text files into pretraining data on disk (memory-mapped shards): MLM + NSP pairs for BERT, "
                    "or MLM sequences for XLM-RoBERTa (--model-type).",
    )
    p.add_argument("corpus", nargs="+", help="text files or directories")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_data_arguments(p)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        index = prepare_from_args(args, args.out, corpus=args.corpus, progress=not args.no_progress)
    except (PrepareError, ValueError, FileNotFoundError) as e:
        report(parser.prog, e)
        return 2
    print(f"prepared {args.out}")
    print(format_summary(index))
    return 0
