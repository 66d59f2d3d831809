"""benchmarks/bench_pretrain.py at a tiny size: it runs, compares the same loss, and writes its JSON."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_pretrain.py")


def test_bench_pretrain_runs_and_writes_json(tmp_path):
    pytest.importorskip("transformers")
    out = str(tmp_path / "bench.json")
    args = [sys.executable, BENCH, "--dtypes", "fp32", "--batch-size", "4", "--seq", "32", "--layers", "1",
            "--hidden", "32", "--heads", "2", "--intermediate", "64", "--vocab", "1200", "--rounds", "2",
            "--warmup", "1", "--batches", "2", "--json", out]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| fp32 | transformers |" in proc.stdout and "| fp32 | fastbert trainer step |" in proc.stdout
    result = json.load(open(out))
    rows = {r["provider"]: r for r in result["rows"]}
    assert set(rows) == {"transformers", "fastbert", "fastbert trainer step"}
    losses = [r["first_loss"] for r in rows.values()]
    assert max(losses) - min(losses) < 1e-3 * max(losses)  # the same loss before training
    assert result["machine"]["torch"] and result["command"]
