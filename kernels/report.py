"""Build report: compile every kernel variant the launchers can pick, for real GPUs, with no GPU,
and keep the last full report with the sources, checked.

    python -m fastbert.kernels.report --arch sm_80,sm_90 --json kernels/build_report.json
    python -m fastbert.kernels.report --check kernels/build_report.json --sample 48
    python -m fastbert.kernels.report --update kernels/build_report.json

For each kernel module in fastbert.kernels.KERNEL_MODULES, `report_configs()` lists the variants
(dtypes, feature flags, tile sizes, num_warps) from the same settings table its launchers use.
A variant also fixes the divisibility-by-16 specialization Triton's JIT makes at launch
(config "aligned": pointers, strides and N multiples of 16, as for N % 16 == 0; or none known).
(The JIT also turns integer arguments equal to 1 into constants, e.g. M = 1: those variants
only drop work from the ones compiled here and are not listed.)
Each variant is compiled for each arch with triton.compile(ASTSource, GPUTarget("cuda", cc, 32));
the cubin is read with cuobjdump from the triton wheel: registers, stack + local bytes (spills),
shared memory, and whether the SASS uses the tensor cores (HMMA / HGMMA; the SASS is only
disassembled when the PTX has a matrix instruction, since nothing else can produce one).

One JSON record per (kernel, config, arch): kernel, arch, config, registers, spill_bytes,
stack_bytes, local_bytes, shared_bytes, tensor_core, ok, error, compile_s. The exit status is
non-zero when any variant fails to compile or spills.

Compilation runs in worker subprocesses (--jobs, default: the CPU count) with TRITON_INTERPRET
removed from their environment: under the interpreter `triton.jit` builds functions that cannot be
compiled, so the report must never compile in a process that imported the kernels interpreted.

The full report compiles thousands of variants (the attention kernels nearly all of them; its time
on 2 cores is in benchmarks/RESULTS.md), so the tree keeps the last one (kernels/build_report.json)
and `--check` stands in for a rebuild where one costs too much (CI). The check fails, with one line
per reason, when

- the report was built from other kernel sources or another triton: its fingerprint (SHA-256 of
  triton's version, the package's device code and constants, and every variant as it is compiled;
  not the launchers, docstrings or comments) differs from the tree's;
- it does not list exactly the variants the launchers can pick today, for its archs;
- any variant in it failed to compile or spilled;
- a variant compiled again now differs from its record in registers, spills, shared memory,
  tensor-core use or success. Compiled again: the variant with the most registers of each
  (kernel, arch), the nearest to spilling, and `sample` more drawn at random (seeded by the
  fingerprint, so the same tree always draws the same ones).

The report also records one fingerprint per kernel module (its own files' device code, that of the
package files it imports, its variants). `--update` compiles again only the variants of the modules
whose fingerprint changed and keeps the other records, which compile as they did: a change to one
kernel costs that kernel's variants, not the whole report. (The check is the same either way.)

A new kernel module is added to KERNEL_MODULES and gives a `report_configs()`.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from . import KERNEL_MODULES, KernelBuild

DEFAULT_ARCHS = ("sm_80", "sm_90")
_W = 28  # width of the kernel-name column
_RECORD_PREFIX = "@@record "


# --------------------------------------------------------------------------------------------
# The list of jobs: (build, arch), the same in the parent and in every worker.


def _parse_archs(archs: Iterable[str]) -> List[str]:
    out = []
    for a in archs:
        a = a.strip()
        if not a:
            continue
        m = re.fullmatch(r"(?:sm_?)?(\d+)a?", a)
        if not m:
            raise ValueError(f"fastbert: unknown arch {a!r}; use sm_80, sm_90, ...")
        out.append(f"sm_{m.group(1)}")
    return out


def kernel_builds(kernels: Optional[Sequence[str]] = None, quick: bool = False) -> List[KernelBuild]:
    """Every KernelBuild of the kernel modules, optionally filtered.

    kernels: keep builds whose kernel name contains one of these substrings.
    quick: per kernel, only the first and the last variant its module lists (smallest and
        largest tiles, flags off and on): a smoke test of every kernel in seconds.
    """
    builds: List[KernelBuild] = []
    for mod_name in KERNEL_MODULES:
        mod = importlib.import_module(f".{mod_name}", __package__)
        builds.extend(mod.report_configs())
    if kernels:
        builds = [b for b in builds if any(k in b.name for k in kernels)]
    if quick:
        by_name: Dict[str, List[KernelBuild]] = {}
        for b in builds:
            by_name.setdefault(b.name, []).append(b)
        builds = [b for bs in by_name.values() for b in (bs[:1] + bs[1:][-1:])]
    return builds


def job_list(archs, kernels, quick, select: Optional[Sequence[int]] = None) -> List[Tuple[KernelBuild, str]]:
    # select: the indices of the jobs to keep (the check's picks), in the unfiltered order
    builds = kernel_builds(kernels, quick)
    jobs = [(b, arch) for arch in archs for b in builds]
    return jobs if select is None else [jobs[i] for i in select]


# --------------------------------------------------------------------------------------------
# Compiling one variant (inside a worker)


def _cuobjdump() -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(path):
        raise FileNotFoundError(f"cuobjdump not found in the triton wheel at {path}")
    return path


def _attrs(build: KernelBuild):
    """Divisibility-by-16 hints, in the form the JIT passes them to the compiler."""
    return {(build.fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in build.divisible}


# PTX matrix instructions: the only source of HMMA / HGMMA in the SASS
_PTX_MMA = re.compile(r"^\s*(mma|wmma|wgmma)\.", re.MULTILINE)


def _resources(cubin: bytes, ptx: str) -> Dict[str, object]:
    """Registers, stack, local, static shared bytes and tensor-core use read from a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([_cuobjdump(), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        tensor_core = False
        if _PTX_MMA.search(ptx):
            sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
            tensor_core = bool(re.search(r"\b(HMMA|HGMMA)\b", sass))
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res))
    return {
        "registers": int(fields.get("REG", -1)),
        "stack_bytes": int(fields.get("STACK", 0)),
        "local_bytes": int(fields.get("LOCAL", 0)),
        "static_shared_bytes": int(fields.get("SHARED", 0)),
        "tensor_core": tensor_core,
    }


def compile_one(build: KernelBuild, arch: str) -> Dict[str, object]:
    """Compile one variant for one arch; a record for the report (never raises)."""
    record: Dict[str, object] = {
        "kernel": build.name,
        "arch": arch,
        "config": record_config(build),
        "registers": None, "spill_bytes": None, "stack_bytes": None, "local_bytes": None,
        "shared_bytes": None, "tensor_core": None,
        "ok": False, "error": None, "compile_s": None,
    }
    t0 = time.perf_counter()
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        signature = dict(build.signature, **{k: "constexpr" for k in build.constexprs})
        src = ASTSource(build.fn, signature, constexprs=build.constexprs,
                        attrs=_attrs(build))
        cc = int(arch[len("sm_"):])
        options = {"num_warps": build.num_warps, "num_stages": build.num_stages}
        if build.maxnreg is not None:
            options["maxnreg"] = build.maxnreg
        kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
        res = _resources(kernel.asm["cubin"], kernel.asm["ptx"])
        res["shared_bytes"] = int(kernel.metadata.shared) + res.pop("static_shared_bytes")
        res["spill_bytes"] = res["stack_bytes"] + res["local_bytes"]
        record.update(res)
        record["ok"] = True
    except Exception as exc:  # a failed variant is a row of the report, not a crash
        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    record["compile_s"] = round(time.perf_counter() - t0, 3)
    return record


def _worker(archs, kernels, quick, select, shard: int, n_shards: int) -> None:
    jobs = job_list(archs, kernels, quick, select)
    for build, arch in jobs[shard::n_shards]:
        print(_RECORD_PREFIX + json.dumps(compile_one(build, arch)), flush=True)


# --------------------------------------------------------------------------------------------
# The parent: spread the jobs over worker subprocesses, gather and print


def _child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # keep 3.9's default, silence its warning
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # see what the parent sees
    return env


def run_report(
    archs: Sequence[str] = DEFAULT_ARCHS,
    kernels: Optional[Sequence[str]] = None,
    quick: bool = False,
    jobs: Optional[int] = None,
    progress: bool = False,
    select: Optional[Sequence[int]] = None,
) -> List[Dict[str, object]]:
    """Compile the selected variants for `archs` in `jobs` worker subprocesses; the records.
    select: only these indices of the unfiltered job list (the check's picks)."""
    archs = _parse_archs(archs)
    n_jobs = len(job_list(archs, kernels, quick, select))
    n_workers = max(1, min(jobs or os.cpu_count() or 1, n_jobs))
    cmd = [sys.executable, "-m", f"{__package__}.report", "--worker", "--arch", ",".join(archs)]
    if kernels:
        cmd += ["--kernels", ",".join(kernels)]
    if quick:
        cmd += ["--quick"]
    if select is not None:
        cmd += ["--select", ",".join(map(str, select))]
    procs = [
        subprocess.Popen(cmd + ["--shard", f"{i}/{n_workers}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_child_env())
        for i in range(n_workers)
    ]
    records: List[Dict[str, object]] = []
    errors = []
    # Workers print one line per record; read them in turn (each pipe drains as it is read, and
    # stderr is small: warnings only, read at the end).
    import selectors

    sel = selectors.DefaultSelector()
    for p in procs:
        sel.register(p.stdout, selectors.EVENT_READ, p)
    open_pipes = len(procs)
    while open_pipes:
        for key, _ in sel.select():
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_pipes -= 1
                continue
            if line.startswith(_RECORD_PREFIX):
                records.append(json.loads(line[len(_RECORD_PREFIX):]))
                if progress and len(records) % 50 == 0:
                    print(f"  compiled {len(records)}/{n_jobs}", file=sys.stderr, flush=True)
    for p in procs:
        err = p.stderr.read()
        if p.wait() != 0:
            errors.append(err.strip()[-2000:])
    if errors or len(records) != n_jobs:
        raise RuntimeError(f"fastbert: report workers failed ({len(records)}/{n_jobs} records):\n" + "\n".join(errors))
    records.sort(key=lambda r: (r["kernel"], r["arch"], json.dumps(r["config"], sort_keys=True)))
    return records


# --------------------------------------------------------------------------------------------
# The full report kept with the sources (build_report.json), and its check


FORMAT = 1
# what must match between a record and the same variant compiled again
_COMPARED = ("ok", "registers", "spill_bytes", "shared_bytes", "tensor_core")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _is_jit(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)


def _names(node: ast.AST) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _targets(node: ast.AST) -> set:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def device_code(sources: Dict[str, str]) -> str:
    """What of the modules' code (path -> source) the compiled variants can depend on: the
    @triton.jit functions, decorators included, and the module-level assignments of the names they
    read (the constants of the device code), as ASTs without docstrings (comments never reach an
    AST). The plain-Python functions, the launchers among them, are left out: how a kernel is called
    does not change what it compiles to (the settings a variant is compiled with are in its build)."""
    trees = {path: ast.parse(source) for path, source in sorted(sources.items())}
    jit = {path: [n for n in tree.body if _is_jit(n)] for path, tree in trees.items()}
    read = set().union(*(_names(f) for fs in jit.values() for f in fs))
    out = []
    for path, tree in trees.items():
        kept = [n for n in tree.body if n in jit[path]
                or (isinstance(n, (ast.Assign, ast.AnnAssign)) and _targets(n) & read)]
        for node in kept:
            for sub in ast.walk(node):
                body = getattr(sub, "body", None)
                if (isinstance(sub, ast.FunctionDef) and body and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                    sub.body = body[1:] or [ast.Pass()]
        out.append(path + "\n" + "\n".join(ast.dump(n) for n in kept))
    return "\n".join(out)


def package_sources() -> Dict[str, str]:
    """The kernel package's Python sources (path relative to it -> text), subpackages included,
    this module excepted."""
    sources = {}
    for folder, dirs, files in os.walk(_HERE):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != os.path.abspath(__file__):
                with open(path) as f:
                    sources[os.path.relpath(path, _HERE)] = f.read()
    return sources


def _hash_builds(h, builds: Iterable[KernelBuild]) -> None:
    for b in builds:
        h.update(json.dumps([b.name, b.signature, {k: repr(v) for k, v in b.constexprs.items()}, b.num_warps,
                             b.num_stages, b.maxnreg, list(b.divisible)], sort_keys=True).encode())


def fingerprint() -> str:
    """SHA-256 of what the compiled variants depend on: triton's version; the device code of the
    kernel package's modules, subpackages included (device_code; this module excepted); and every
    variant as triton.compile receives it (kernel, argument types, constexprs, launch options,
    divisibility)."""
    import triton

    h = hashlib.sha256(f"triton {triton.__version__}\n{device_code(package_sources())}\n".encode())
    _hash_builds(h, kernel_builds())
    return h.hexdigest()


def _local_imports(path: str, source: str, sources: Dict[str, str]) -> List[str]:
    """The package files a source file imports relatively (`from . import x`, `from .x import y`,
    `from .. import z`), as keys of `sources`."""
    out = []
    folder = os.path.dirname(path)
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        base = folder
        for _ in range(node.level - 1):
            base = os.path.dirname(base)
        stems = [node.module.replace(".", "/")] if node.module else [a.name for a in node.names]
        for stem in stems + [""]:  # the named modules, and the package whose __init__ runs first
            for cand in (os.path.join(base, stem + ".py"), os.path.join(base, stem, "__init__.py")):
                cand = os.path.normpath(cand)
                if cand in sources:
                    out.append(cand)
    return out


def module_fingerprints(sources: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """One SHA-256 per kernel module (KERNEL_MODULES), of what its variants depend on: triton's
    version, the device code of its own files and of every package file they import (the shared
    helpers of kernels/__init__.py, another module's jit functions), and its variants. A module
    whose fingerprint has not changed compiles to what the report recorded (`--update`).
    sources: the package's files (package_sources(), by default)."""
    import triton

    sources = package_sources() if sources is None else sources
    out = {}
    for name in KERNEL_MODULES:
        own = [p for p in sources if p == f"{name}.py" or p.startswith(f"{name}/")]
        files, todo = set(), list(own)
        while todo:
            p = todo.pop()
            if p not in files:
                files.add(p)
                todo += _local_imports(p, sources[p], sources)
        h = hashlib.sha256(f"triton {triton.__version__}\n{device_code({p: sources[p] for p in files})}\n".encode())
        _hash_builds(h, importlib.import_module(f".{name}", __package__).report_configs())
        out[name] = h.hexdigest()
    return out


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

    head = {"format": FORMAT, "fingerprint": fingerprint(), "modules": module_fingerprints(),
            "triton": triton.__version__, "archs": list(archs), "variants": len(records)}
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
    jobs_now = job_list(saved["archs"], None, False)
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
    for r in run_report(saved["archs"], select=sorted(index[k] for k in picks), jobs=jobs):
        was = by_key[key(r)]
        diff = [f"{f} {was[f]} -> {r[f]}" for f in _COMPARED if was[f] != r[f]]
        if diff:
            problems.append(f"{r['kernel']} {r['arch']} {r['config']}: compiled now, {', '.join(diff)}")
    print(f"compiled {len(picks)} of the report's {len(records)} variants again: "
          f"{'all as recorded' if not problems else 'see below'}")
    return problems


def update(path: str, jobs: Optional[int] = None) -> List[Dict[str, object]]:
    """The full report at `path` brought up to date by compiling only the variants of the kernel
    modules whose fingerprint (module_fingerprints) differs from the one it records, the others'
    records kept; written back to `path`. A report from before the per-module fingerprints counts
    as recording the tree's own where its whole fingerprint is the tree's (nothing changed)."""
    with open(path) as f:
        saved = json.load(f)
    if saved.get("format") != FORMAT:
        raise SystemExit(f"fastbert.kernels.report: {path}: format {saved.get('format')!r}, not {FORMAT}; "
                         f"rebuild it with --json {path}")
    archs, now = saved["archs"], module_fingerprints()
    old = saved.get("modules") or (now if saved["fingerprint"] == fingerprint() else {})
    stale = [m for m in KERNEL_MODULES if old.get(m) != now[m]]
    stale_kernels = {b.name for m in stale for b in importlib.import_module(f".{m}", __package__).report_configs()}
    kept = [r for r in saved["records"] if r["kernel"] not in stale_kernels]
    jobs_now = job_list(archs, None, False)
    select = [i for i, (b, _) in enumerate(jobs_now) if b.name in stale_kernels]
    print(f"kernel modules changed: {', '.join(stale) or 'none'}; compiling their {len(select)} variants, "
          f"keeping {len(kept)} records", file=sys.stderr)
    records = kept + (run_report(archs, select=select, jobs=jobs, progress=True) if select else [])
    listed, wanted = {key(r) for r in records}, {job_key(b, a) for b, a in jobs_now}
    if listed != wanted:  # a kernel that moved between modules, or records of a removed one
        raise SystemExit(f"fastbert.kernels.report: {path} would list {len(listed - wanted)} variants the launchers "
                         f"do not pick and miss {len(wanted - listed)}; rebuild it with --json {path}")
    records.sort(key=lambda r: (r["kernel"], r["arch"], json.dumps(r["config"], sort_keys=True)))
    write(path, records, archs)
    return records


def _config_str(config: Dict[str, object]) -> str:
    def fmt(v):
        return {True: "1", False: "0"}.get(v, str(v)) if isinstance(v, bool) else str(v)

    return " ".join(f"{k}={fmt(v)}" for k, v in config.items() if k not in ("num_warps", "num_stages", "maxnreg"))


def format_table(records: Sequence[Dict[str, object]]) -> str:
    head = f"{'kernel':<{_W}} {'arch':<6} {'warps':>5} {'regs':>4} {'spill':>5} {'smem':>6} {'TC':>2}  {'ok':<4} config"
    lines = [head, "-" * len(head)]
    for r in records:
        c = r["config"]
        lines.append(
            f"{r['kernel']:<{_W}} {r['arch']:<6} {c['num_warps']:>5} {str(r['registers']):>4} "
            f"{str(r['spill_bytes']):>5} {str(r['shared_bytes']):>6} {'y' if r['tensor_core'] else '-':>2}  "
            f"{'ok' if r['ok'] else 'FAIL':<4} {_config_str(c)}"
            + (f"\n    error: {r['error']}" if r["error"] else "")
        )
    return "\n".join(lines)


def format_summary(records: Sequence[Dict[str, object]], seconds: Optional[float] = None) -> str:
    lines = [f"{'kernel':<{_W}} {'arch':<6} {'variants':>8} {'failed':>6} {'spilled':>7} "
             f"{'max regs':>8} {'max smem':>8}  at max regs"]
    groups: Dict[Tuple[str, str], List[Dict[str, object]]] = {}
    for r in records:
        groups.setdefault((r["kernel"], r["arch"]), []).append(r)
    for (kernel, arch), rs in sorted(groups.items()):
        good = [r for r in rs if r["ok"]]
        worst = max(good, key=lambda r: r["registers"], default=None)
        lines.append(
            f"{kernel:<{_W}} {arch:<6} {len(rs):>8} {len(rs) - len(good):>6} "
            f"{sum(1 for r in good if r['spill_bytes'] > 0):>7} "
            f"{(worst['registers'] if worst else '-'):>8} {max((r['shared_bytes'] for r in good), default='-'):>8}  "
            + (f"warps={worst['config']['num_warps']} {_config_str(worst['config'])}" if worst else "")
        )
    failed = [r for r in records if not r["ok"]]
    spilled = [r for r in records if r["ok"] and r["spill_bytes"] > 0]
    total = f"{len(records)} variants: {len(failed)} failed to compile, {len(spilled)} spill"
    if seconds is not None:
        total += f" ({seconds:.0f} s)"
    lines.append(total)
    return "\n".join(lines)


def report_failed(records: Sequence[Dict[str, object]]) -> bool:
    return any((not r["ok"]) or r["spill_bytes"] > 0 for r in records)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastbert.kernels.report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default=",".join(DEFAULT_ARCHS), help="comma-separated, e.g. sm_80,sm_90")
    parser.add_argument("--json", metavar="PATH", help="write the records to this JSON file")
    parser.add_argument("--kernels", default="", help="comma-separated substrings of kernel names to keep")
    parser.add_argument("--quick", action="store_true", help="first and last variant of each kernel only")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    parser.add_argument("--summary-only", action="store_true", help="print the summary, not every variant")
    parser.add_argument("--check", metavar="PATH", help="check a saved full report instead: current, "
                        "complete, no failure or spill, and true for the variants compiled again")
    parser.add_argument("--update", metavar="PATH", help="bring a saved full report up to date: compile the "
                        "variants of the kernel modules that changed since it was written, keep the others' records")
    parser.add_argument("--sample", type=int, default=48, help="--check: variants compiled again beyond the "
                        "most-register one of each kernel and arch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--select", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    archs = _parse_archs(args.arch.split(","))
    kernels = [k for k in args.kernels.split(",") if k] or None

    if args.worker:
        shard, n_shards = (int(v) for v in args.shard.split("/"))
        select = [int(i) for i in args.select.split(",")] if args.select else None
        _worker(archs, kernels, args.quick, select, shard, n_shards)
        return 0
    if args.check:
        problems = check(args.check, args.sample, args.jobs)
        for line in problems:
            print(f"fastbert.kernels.report: {line}", file=sys.stderr)
        return 1 if problems else 0

    if args.update:
        t0 = time.perf_counter()
        records = update(args.update, args.jobs)
        print(format_summary(records, time.perf_counter() - t0))
        return 1 if report_failed(records) else 0

    t0 = time.perf_counter()
    records = run_report(archs, kernels, args.quick, args.jobs, progress=True)
    seconds = time.perf_counter() - t0
    if not args.summary_only:
        print(format_table(records))
        print()
    print(format_summary(records, seconds))
    if args.json:
        write(args.json, records, archs)
        print(f"wrote {len(records)} records to {args.json}")
    return 1 if report_failed(records) else 0


if __name__ == "__main__":
    sys.exit(main())
