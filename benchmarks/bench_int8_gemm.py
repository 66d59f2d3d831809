"""fastbert's own int8 GEMM on one BERT-base layer's four products (768x2304, 768x768, 768x3072,
3072x768), on weights in [-127, 127] (int8 layers' default) and in [-64, 64] (weight_range=64), each
in the plain layout ([out, in], packed on every call: int8_gemm.cpp) and stored packed (the
layer's only copy: int8_gemm_packed.cpp), at a few row counts. Milliseconds for the four products,
the fastest of --rounds rounds in which every case runs in turn, and the multiply-adds a second.
Which scheme each case runs is the kernels' own choice (csrc/kernels/int8_gemm_schemes.h); every
case's product is checked exact against int64 once. On a CPU with AMX int8 tiles (which the packed
layout runs on at the level amx), the packed layout is timed a second time at the level below
("packed, no AMX": the VNNI kernel), so the two compare in one run.

    python benchmarks/bench_int8_gemm.py [--rows 21,129,513] [--rounds 3] [--json PATH]
"""
from __future__ import annotations

import contextlib
import time

import torch

from fastbert import backend, layouts
from fastbert.bench.report import add_output_options, finish, parser

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # (in, out)
CASES = [(127, "plain"), (127, "packed"), (64, "plain"), (64, "packed")]


def measure(rows: int, rounds: int, g: torch.Generator) -> list:
    plain, packed = backend.cpp_function("int8_gemm"), backend.cpp_function("int8_gemm_packed")
    run = {"plain": lambda a, w: plain(a, w, None), "packed": packed, "packed, no AMX": packed}
    cases = CASES + ([(127, "packed, no AMX")] if backend.cpu_capability() == "amx" else [])

    def level(layout):  # the packed GEMM with AMX's tiles off: the level below, its VNNI kernel
        return backend.cpu_capability_scope("avx512_vnni") if layout == "packed, no AMX" else contextlib.nullcontext()

    calls = {}
    for r, layout in cases:
        work = []
        for k, n in SHAPES:
            a = torch.randint(-127, 128, (rows, k), generator=g, dtype=torch.int8)
            w = torch.randint(-r, r + 1, (n, k), generator=g, dtype=torch.int8)
            b = w if layout == "plain" else layouts.pack_weight(w)
            with level(layout):
                if not torch.equal(run[layout](a, b).long(), a.long() @ w.long().t()):
                    raise RuntimeError(f"the int8 GEMM is not exact: {layout}, weights in [-{r}, {r}], {rows} rows")
            work.append((a, b))
        calls[(r, layout)] = lambda f=run[layout], work=work: [f(a, b) for a, b in work]
    best = {key: float("inf") for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            reps = max(3, int(2e8 / (rows * sum(k * n for k, n in SHAPES))))
            with level(key[1]):
                call()
                t0 = time.perf_counter()
                for _ in range(reps):
                    call()
                best[key] = min(best[key], (time.perf_counter() - t0) / reps)
    macs = rows * sum(k * n for k, n in SHAPES)
    return [{"rows": rows, "weights": f"[-{r}, {r}]", "layout": layout, "ms": t * 1e3, "gmacs": macs / t / 1e9}
            for (r, layout), t in best.items()]


def print_rows(rows) -> None:
    amx = "AMX int8 tiles on" if backend.cpp_extension().int8_amx() else "no AMX int8 tiles"
    print(f"fastbert kernel level {backend.cpu_capability()}, {amx}, {torch.get_num_threads()} threads")
    print("| rows | weights | layout | ms (4 products) | G int-MAC/s |")
    print("|---:|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['rows']} | {r['weights']} | {r['layout']} | {r['ms']:.2f} | {r['gmacs']:.0f} |")


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--rows", default="21,129,513", help="comma-separated row counts (tokens)")
    ap.add_argument("--rounds", type=int, default=3)
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    if backend.cpp_function("int8_gemm_packed") is None:
        ap.error("the C++ extension is not built: pip install --no-build-isolation -e .")
    g = torch.Generator().manual_seed(0)
    rows = [row for m in args.rows.split(",") for row in measure(int(m), args.rounds, g)]
    finish(rows, print_rows, argv, json_path=args.json)


if __name__ == "__main__":
    main()
