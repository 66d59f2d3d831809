"""`fastbert bench`: the encoder benchmark (fastbert.bench.encoder) at a size that runs in about a
minute on 2 cores: the var128 workload, 2 layers, fp32 (--peers adds the peers that are installed)."""
from __future__ import annotations

from fastbert.commands import CommandParser


def main(argv=None) -> int:
    from fastbert.bench import encoder

    return encoder.main(argv, defaults=dict(workloads="var128", dtypes="float32", layers=2, rounds=3),
                        prog="fastbert bench", parser_class=CommandParser)
