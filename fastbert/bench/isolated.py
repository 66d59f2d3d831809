"""Time each engine of a benchmark alone in a process of its own: the encoder benchmark's providers
(`bench_encoder --isolate`) and the newer encoders' engines (bench_modernbert, by default).

Providers timed in turn in one process are not alike on a machine of few cores: thread pools keep
spin-waiting after a call returns (ONNX Runtime's; Intel's OpenMP for 200 ms), and an engine that
has run in a process slows the others that run in it later (benchmarks/RESULTS.md, "Measured
again"). Here the parent writes the batch to a file and, pass after pass, starts one child per
provider: the child builds the providers of that engine (fastbert's, transformers' and the GEMM
floors, plus the one peer the provider belongs to, if any), calls the provider twice untimed and
then `calls` times timed, and prints the seconds as JSON. Each provider's times gather every pass
(passes alternate the engines, so that a change in the machine's load reaches them all alike).

    python -m fastbert.bench.isolated BATCH_FILE NAME '{"layers": 12, "dtypes": ["float32"], ...}'

The newer encoders (isolated_engine_runs): the parent writes every workload's batch and the ONNX
file exported once; pass after pass, one child per engine (fastbert's model, transformers', or one
peer's engine of that file) builds only that engine, runs each workload once untimed (its output at
the real tokens, kept from the first pass, is what the parent compares), then `calls` times timed.

    python -m fastbert.bench.isolated --modern SPEC_FILE ENGINE OUT_FILE
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fastbert.bench.peers import PEERS


def peer_of(name: str) -> List[str]:
    # the peer whose provider `name` is ("onnxruntime int8" -> ["onnxruntime"]); none for fastbert's
    return [p for p in PEERS if name.startswith(p + " ")]


def isolated_times(names: Sequence[str], layers: int, dtypes, ids, mask, arch: str, calls: int, passes: int = 2,
                   progress: bool = True) -> Dict[str, List[float]]:
    """{name: seconds of each timed call}, every provider timed alone in a child process."""
    from tqdm import tqdm

    spec = {"layers": layers, "dtypes": [str(d).removeprefix("torch.") for d in dtypes], "arch": arch, "calls": calls}
    times: Dict[str, List[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as d:
        batch = os.path.join(d, "batch.pt")
        torch.save({"ids": ids, "mask": mask}, batch)
        bar = tqdm(total=passes * len(names), desc="providers, each in its own process", disable=not progress,
                   file=sys.stderr)
        for _ in range(passes):
            for name in names:
                out = subprocess.run([sys.executable, "-m", "fastbert.bench.isolated", batch, name, json.dumps(spec)],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"fastbert bench: timing {name!r} alone failed: {out.stderr.strip()[-2000:]}")
                times[name] += json.loads(out.stdout.strip().splitlines()[-1])
                bar.update(1)
        bar.close()
    return times


def isolated_engine_runs(model: str, layers: int, dtype: torch.dtype, engines: Sequence[str], batches: dict,
                         onnx: Optional[str], trace: tuple, calls: int, passes: int = 2, progress: bool = True
                         ) -> Tuple[Dict[str, Dict[str, torch.Tensor]], Dict[str, Dict[str, List[float]]],
                                    Dict[str, str]]:
    """({engine: {workload: last hidden state at the real tokens, fp32}}, {engine: {workload: seconds of
    each timed call}}, {engine: why it could not be built}) of the family `model` (MODERN_ARCHS) at
    `layers` layers in `dtype`: engines of "fastbert", "transformers" (fp32 where dtype is int8) and
    ONNX_PEERS (on the ONNX file `onnx`; an int8 OpenVINO calibrated on `trace`, the (ids, mask) it
    was exported on), each built and timed alone in a child process, `passes` times; batches:
    {workload: (ids, mask)}."""
    from tqdm import tqdm

    outs: Dict[str, Dict[str, torch.Tensor]] = {}
    times: Dict[str, Dict[str, List[float]]] = {e: {w: [] for w in batches} for e in engines}
    skipped: Dict[str, str] = {}
    with tempfile.TemporaryDirectory() as d:
        spec = os.path.join(d, "spec.pt")
        torch.save(dict(model=model, layers=layers, dtype=str(dtype).removeprefix("torch."), batches=batches,
                        onnx=onnx, trace=trace, calls=calls), spec)
        bar = tqdm(total=passes * len(engines), desc="engines, each in its own process", disable=not progress,
                   file=sys.stderr)
        for _ in range(passes):
            for engine in engines:
                if engine in skipped:
                    bar.update(1)
                    continue
                got = os.path.join(d, "out.pt")
                out = subprocess.run([sys.executable, "-m", "fastbert.bench.isolated", "--modern", spec, engine, got],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"fastbert bench: running {engine!r} alone failed: {out.stderr.strip()[-2000:]}")
                result = torch.load(got)
                if result["skipped"]:
                    skipped[engine] = result["skipped"]
                else:
                    outs.setdefault(engine, result["outs"])
                    for w, seconds in result["times"].items():
                        times[engine][w] += seconds
                bar.update(1)
        bar.close()
    return outs, {e: t for e, t in times.items() if e not in skipped}, skipped


def modern_main(spec: str, engine: str, out: str) -> int:
    """The child of isolated_engine_runs: builds `engine` alone, runs and times every workload, writes
    {"outs", "times", "skipped"} to `out`."""
    from fastbert.bench.peers import onnx_engine
    from fastbert.bench.workloads import modern_models, modern_transformers

    spec = torch.load(spec)
    dtype = getattr(torch, spec["dtype"])
    if engine in ("fastbert", "transformers"):
        if engine == "fastbert":
            model = modern_models(spec["model"], spec["layers"], "cpp", int8=dtype == torch.int8)[1]
        else:
            model = modern_transformers(spec["model"], spec["layers"])
        if dtype == torch.bfloat16:
            model.to(dtype)
        run, why = (lambda i, m: model(input_ids=i, attention_mask=m).last_hidden_state), ""
    else:
        run, why = onnx_engine(engine, spec["onnx"], dtype, *spec["trace"])
    outs: Dict[str, torch.Tensor] = {}
    times: Dict[str, List[float]] = {}
    if run is not None:
        with torch.inference_mode():
            for name, (ids, mask) in spec["batches"].items():
                outs[name] = run(ids, mask)[mask.bool()].float()
                times[name] = []
                for _ in range(spec["calls"]):
                    t0 = time.perf_counter()
                    run(ids, mask)
                    times[name].append(time.perf_counter() - t0)
    torch.save({"outs": outs, "times": times, "skipped": why}, out)
    return 0


def main(argv=None) -> int:
    from fastbert.bench.providers import encoder_providers

    argv = argv if argv is not None else sys.argv[1:]
    if argv and argv[0] == "--modern":
        return modern_main(*argv[1:])
    batch, name, spec = argv
    spec = json.loads(spec)
    data = torch.load(batch)
    dtypes = [getattr(torch, d) for d in spec["dtypes"]]
    provs, _, skipped = encoder_providers(spec["layers"], dtypes, data["ids"], data["mask"], peer_of(name),
                                          spec["arch"])
    if name not in provs:
        raise SystemExit(f"fastbert bench: no provider {name!r} here ({skipped.get(name, 'unknown')})")
    fn, seconds = provs[name], []
    with torch.no_grad():
        fn(), fn()
        for _ in range(spec["calls"]):
            t0 = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - t0)
    print(json.dumps(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
