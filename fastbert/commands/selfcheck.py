"""`fastbert selfcheck`: every fused op on every backend here against the fp64 reference (what is
checked and with which bound: fastbert.selfcheck)."""
from __future__ import annotations

import argparse
import contextlib
import sys

import torch

import fastbert
from fastbert import backend as fb_backend
from fastbert import selfcheck
from fastbert.commands import CommandParser


def main(argv=None) -> int:
    from tqdm import tqdm

    ap = CommandParser(prog="fastbert selfcheck", description=selfcheck.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    args = ap.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available here")
    levels = fb_backend.cpu_capabilities() if device == "cpu" else []
    print(f"fastbert {fastbert.__version__}, torch {torch.__version__}, device {device}, "
          f"backends {selfcheck.available_backends(device)}, C++ kernel levels {levels} "
          f"(running: {fb_backend.cpu_capability()}, CPU: {', '.join(fb_backend.cpu_features()) or 'no AVX2'})")
    todo = [(b, level, op, shape, dtype) for b in selfcheck.available_backends(device) + ["auto"]
            for level in (levels or [None] if b in ("cpp", "auto") else [None])
            for op, shape, dtype in selfcheck.cases(device, b == "triton" and device == "cpu")
            if b in selfcheck.op_backends(op, device)]
    failures, lines = 0, []
    for b, level, op, shape, dtype in tqdm(todo, desc="selfcheck", file=sys.stderr):
        with fb_backend.cpu_capability_scope(level) if level else contextlib.nullcontext():
            rows = selfcheck.check_case(op, shape, dtype, b, device)
        tag = b if level is None else f"{b}@{level}"
        for name, ok, err, bound in rows:
            failures += not ok
            lines.append(f"{tag:<19}{op:<24}{str(shape):<18}{str(dtype)[6:]:<10}{name:<17}{err:>11.2e}"
                         f"{bound:>11.2e}  " + ("ok" if ok else "FAIL"))
    print(f"{'backend':<19}{'op':<24}{'shape':<18}{'dtype':<10}{'tensor':<17}{'max err':>11}{'bound':>11}")
    print("\n".join(lines))
    print(f"{len(lines) - failures} passed, {failures} failed")
    return 1 if failures else 0
