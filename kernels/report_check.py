"""The build report kept with the sources, and the check that it is current and true.

    python -m fastbert.kernels.report --arch sm_80,sm_90 --json kernels/build_report.json
    python -m fastbert.kernels.report --check kernels/build_report.json --sample 48

The full report compiles every variant for every arch (thousands; most of an hour on 2 CPU cores
with an empty Triton cache), so the tree keeps the last full report, and a check stands in for it
where a full rebuild costs too much (CI). The check fails, with one line per reason, when

- the report was built from other kernel sources or another triton: its fingerprint (SHA-256 of
  the code of this package's modules, this one excepted, docstrings and comments left out, and
  triton's version) differs from the tree's;
- it does not list exactly the variants the launchers can pick today, for its archs;
- any variant in it failed to compile or spilled;
- a variant compiled again now differs from its record in registers, spills, shared memory,
  tensor-core use or success. Compiled again: the variant with the most registers of each
  (kernel, arch), the nearest to spilling, and `sample` more drawn at random (seeded by the
  fingerprint, so the same tree always draws the same ones).
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import random
from typing import Dict, List, Optional, Sequence, Tuple

FORMAT = 1
# what must match between a record and the same variant compiled again
_COMPARED = ("ok", "registers", "spill_bytes", "shared_bytes", "tensor_core")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _code(source: str) -> str:
    # a module's code without its prose: the AST with every docstring dropped (comments never reach it)
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def fingerprint() -> str:
    """SHA-256 of the code of the kernel package's modules (names and ASTs without docstrings or
    comments, this module excepted) and triton's version: what the compiled variants depend on."""
    import triton

    h = hashlib.sha256(f"triton {triton.__version__}\n".encode())
    for name in sorted(os.listdir(_HERE)):
        if name.endswith(".py") and name != os.path.basename(__file__):
            with open(os.path.join(_HERE, name)) as f:
                h.update(f"{name}\n{_code(f.read())}\n".encode())
    return h.hexdigest()


def key(record: Dict[str, object]) -> Tuple[str, str, str]:
    """(kernel, arch, config as sorted JSON): a variant's identity, in a record and in a job."""
    return record["kernel"], record["arch"], json.dumps(record["config"], sort_keys=True)


def record_config(build) -> Dict[str, object]:
    """A variant's config as its record holds it: the build's config and its launch options."""
    return dict(build.config, num_warps=build.num_warps, num_stages=build.num_stages, maxnreg=build.maxnreg)


def job_key(build, arch: str) -> Tuple[str, str, str]:
    return build.name, arch, json.dumps(record_config(build), sort_keys=True)


def write(path: str, records: Sequence[Dict[str, object]], archs: Sequence[str]) -> None:
    """The report as JSON: a header, then one record per line (compile times left out, so that a
    rebuild changes only the lines of variants whose resources changed)."""
    import triton

    head = {"format": FORMAT, "fingerprint": fingerprint(), "triton": triton.__version__, "archs": list(archs),
            "variants": len(records)}
    lines = [json.dumps({k: v for k, v in r.items() if k != "compile_s"}, sort_keys=True) for r in records]
    with open(path, "w") as f:
        f.write(json.dumps(head)[:-1] + ', "records": [\n' + ",\n".join(lines) + "\n]}\n")


def _picks(records: Sequence[Dict[str, object]], sample: int, seed: str) -> List[Tuple[str, str, str]]:
    # the most-register variant of each (kernel, arch), and `sample` more at random
    worst: Dict[Tuple[str, str], Dict[str, object]] = {}
    for r in records:
        k = (r["kernel"], r["arch"])
        if k not in worst or (r["registers"] or 0) > (worst[k]["registers"] or 0):
            worst[k] = r
    chosen = {key(r) for r in worst.values()}
    rest = sorted(key(r) for r in records if key(r) not in chosen)
    chosen.update(random.Random(seed).sample(rest, min(sample, len(rest))))
    return sorted(chosen)


def check(path: str, sample: int = 48, jobs: Optional[int] = None) -> List[str]:
    """The reasons the report at `path` is stale or untrue (empty: it holds), compiling the
    variants `_picks` chooses again."""
    from . import report

    if not os.path.exists(path):
        return [f"{path}: no such file; build it with `python -m fastbert.kernels.report --json {path}`"]
    with open(path) as f:
        saved = json.load(f)
    rebuild = f"rebuild it: python -m fastbert.kernels.report --arch {','.join(saved.get('archs', []))} --json {path}"
    if saved.get("format") != FORMAT:
        return [f"{path}: format {saved.get('format')!r}, not {FORMAT}; {rebuild}"]
    if saved["fingerprint"] != fingerprint():
        return [f"{path} was built from other kernel sources or another triton (built with {saved['triton']}); "
                f"{rebuild}"]
    records = saved["records"]
    problems = []
    jobs_now = report._jobs(saved["archs"], None, False)
    listed, now = {key(r) for r in records}, {job_key(b, a) for b, a in jobs_now}
    if listed != now:
        problems.append(f"{path} lists {len(listed - now)} variants the launchers no longer pick and misses "
                        f"{len(now - listed)} they do; {rebuild}")
    bad = [r for r in records if not r["ok"] or r["spill_bytes"]]
    if bad:
        problems.append(f"{path}: {len(bad)} variants failed or spilled, e.g. {bad[0]['kernel']} {bad[0]['arch']} "
                        f"{bad[0]['config']}")
    picks = [k for k in _picks(records, sample, saved["fingerprint"]) if k in now]
    index = {job_key(b, a): i for i, (b, a) in enumerate(jobs_now)}
    by_key = {key(r): r for r in records}
    for r in report.run_report(saved["archs"], select=sorted(index[k] for k in picks), jobs=jobs):
        was = by_key[key(r)]
        diff = [f"{f} {was[f]} -> {r[f]}" for f in _COMPARED if was[f] != r[f]]
        if diff:
            problems.append(f"{r['kernel']} {r['arch']} {r['config']}: compiled now, {', '.join(diff)}")
    print(f"compiled {len(picks)} of the report's {len(records)} variants again: "
          f"{'all as recorded' if not problems else 'see below'}")
    return problems
