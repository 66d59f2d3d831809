"""Two source trees of fastbert on the same workloads, in processes that alternate: whether a change
moved the speed of what users run. Each tree must have its extension built in place (a git worktree:
`git worktree add /tmp/before <rev> && cd /tmp/before && python setup.py build_ext --inplace`).
Workloads (BERT-base shapes, random weights, fastbert alone):

    infer   var128 (32 sequences of 16..128 tokens, real tokens a second) and one20 (one sequence
            of 20 tokens, ms a call), fp32 and int8
    train   a fine-tuning step: BertForSequenceClassification, batch 16 of 16..128 tokens, forward,
            backward, fused AdamW (s a step)

Each process prints one line of medians; --pairs pairs of processes run, the order of the two trees
swapped every other pair (the first process of a pair may run on a cooler or quieter machine); the
table gives each tree's median over its processes and after / before.

    python benchmarks/bench_trees.py --before /tmp/before [--after .] [--pairs 3] [--workload infer,train]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _timed(f, rounds: int) -> float:
    f()
    f()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(workload: str) -> dict:
    """In the tree this process imports fastbert from: {figure name: value}."""
    import torch

    import fastbert
    import fastbert.hf
    from fastbert.bench.workloads import WORKLOADS, make_batch, random_transformers_encoder

    hf = random_transformers_encoder(12)
    out = {}
    if workload == "infer":
        for quantize in (None, "int8"):
            model = fastbert.hf.from_transformers(hf).eval()
            if quantize:
                model.quantize_(quantize)
            for name, rounds in (("var128", 5), ("one20", 40)):
                spec = WORKLOADS[name]
                ids, mask = make_batch(spec["batch"], spec["lo"], spec["hi"], torch.Generator().manual_seed(0))
                with torch.no_grad():
                    t = _timed(lambda: model(ids, mask), rounds)  # noqa: B023 (called at once)
                if name == "var128":
                    out[f"var128 {quantize or 'fp32'} tokens/s"] = int(mask.sum()) / t
                else:
                    out[f"one20 {quantize or 'fp32'} ms"] = t * 1e3
    else:
        config = fastbert.BertConfig(**hf.config.to_dict(), num_labels=2)
        torch.manual_seed(0)
        model = fastbert.BertForSequenceClassification(config).train()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
        batches = [make_batch(16, 16, 128, torch.Generator().manual_seed(i)) for i in range(3)]
        labels = torch.tensor([0, 1] * 8)
        step = [0]

        def train_step():
            ids, mask = batches[step[0] % len(batches)]
            step[0] += 1
            model(ids, mask, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        out["fine-tuning fp32 s/step"] = _timed(train_step, 3)
    out["fastbert"] = os.path.dirname(os.path.dirname(os.path.abspath(fastbert.__file__)))
    return out


def run_tree(tree: str, workload: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", workload], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if os.path.realpath(figures.pop("fastbert")) != os.path.realpath(tree):
        raise RuntimeError(f"the process in {tree} imported fastbert from elsewhere")
    return figures


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="the tree to compare against (its extension built in place)")
    ap.add_argument("--after", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workload", default="infer,train")
    ap.add_argument("--measure", choices=["infer", "train"], help=argparse.SUPPRESS)  # in a tree's own process
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    if not args.before:
        ap.error("--before is required: a tree to compare against")
    from fastbert.bench.report import header

    header(" ".join(["python", "benchmarks/bench_trees.py", *(sys.argv[1:] if argv is None else argv)]),
           before=args.before, after=args.after)
    print("| workload | before | after | after / before | processes |")
    print("|---|---:|---:|---:|---:|")
    for workload in args.workload.split(","):
        got = {"before": [], "after": []}
        for i in range(args.pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for which in order:
                got[which].append(run_tree(getattr(args, which), workload))
        for name in got["before"][0]:
            b = statistics.median(r[name] for r in got["before"])
            a = statistics.median(r[name] for r in got["after"])
            print(f"| {name} | {b:.4g} | {a:.4g} | {a / b:.3f} | {args.pairs} each |", flush=True)


if __name__ == "__main__":
    main()
