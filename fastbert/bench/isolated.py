"""Time each provider of the encoder benchmark alone in a process of its own (`bench_encoder --isolate`).

Providers timed in turn in one process are not alike on a machine of few cores: thread pools keep
spin-waiting after a call returns (ONNX Runtime's; Intel's OpenMP for 200 ms), and an engine that
has run in a process slows the others that run in it later (benchmarks/RESULTS.md, "Measured
again"). Here the parent writes the batch to a file and, pass after pass, starts one child per
provider: the child builds the providers of that engine (fastbert's, transformers' and the GEMM
floors, plus the one peer the provider belongs to, if any), calls the provider twice untimed and
then `calls` times timed, and prints the seconds as JSON. Each provider's times gather every pass
(passes alternate the engines, so that a change in the machine's load reaches them all alike).

    python -m fastbert.bench.isolated BATCH_FILE NAME '{"layers": 12, "dtypes": ["float32"], ...}'
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence

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


def main(argv=None) -> int:
    from fastbert.bench.providers import encoder_providers

    batch, name, spec = (argv if argv is not None else sys.argv[1:])
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
