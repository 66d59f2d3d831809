"""What fastbert's CUDA code path costs the host, measured on any CPU (no GPU): the Triton backend
runs on CPU tensors through the interpreter with every Triton launch counted instead of run
(fastbert.bench.host). For each fused op (BERT-base's sizes, a padded batch of 8 x 64) and for a
whole BERT-base and ModernBERT-base layer, in inference (forward) and training (forward +
backward), it prints

  launches      Triton launches
  aten          aten calls (torch's dispatcher, below autograd)
  launch/alloc  the aten calls that launch a kernel or allocate on a GPU (all but views and syncs)
  syncs         host syncs (.item(), .tolist(), nonzero, value-dependent shapes)
  ops           launches + launch/alloc: what the GPU's queue receives
  host us       host microseconds per call, launches skipped (timed at tiny sizes, where the CPU's
                arithmetic in the torch calls costs next to nothing; this CPU's figure)
  floor us      the same call's aten calls that launch or allocate, replayed back to back: what
                its operations cost the host with nothing around them
  own us        host us - floor us: the host time beyond the launches (Python, autograd, views)

A layer's row is its family's three-layer model less its one-layer one, halved (a time's noise,
which the difference carries whole, halved with it). The counts are exact and the same on every
machine (tests/bench/test_host.py holds them); the times are this CPU's.

    python benchmarks/bench_host.py [--no-times] [--calls 20] [--rounds 5] [--json PATH]
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the launchers run on the CPU

from fastbert.bench.report import add_output_options, finish, parser  # noqa: E402


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--no-times", action="store_true", help="counts only")
    ap.add_argument("--calls", type=int, default=20, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds, every call in turn (the fastest is kept)")
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError:
        print("# skipped: triton is not installed (pip install triton); the counts run its interpreter")
        return 0
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("# skipped: TRITON_INTERPRET is set to something other than 1; the counts need the interpreter")
        return 0
    from fastbert.bench import host

    rows = host.measure(host.cases(), time_calls=not args.no_times, calls=args.calls, rounds=args.rounds)
    finish(host.as_dicts(rows), lambda _: print(host.format_rows(rows)), argv, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
