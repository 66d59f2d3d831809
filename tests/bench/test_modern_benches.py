"""The newer encoders' benchmarks run end to end at a tiny size and check their own answers: the
fused model's outputs against transformers' (bench_modernbert) and the rows they report."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model", ["modernbert", "mpnet"])
def test_bench_modernbert_runs_and_agrees_with_transformers(tmp_path, model, capsys):
    out = tmp_path / "rows.json"
    _script("bench_modernbert").main(["--model", model, "--layers", "1", "--rounds", "1", "--workloads", "var128",
                                      "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["workload"] for r in rows] == ["var128"]
    assert rows[0]["max_abs_err"] < 1e-4 and rows[0]["speedup"] > 0
    assert "var128" in capsys.readouterr().out


def test_bench_modernbert_refuses_an_unknown_workload():
    with pytest.raises(SystemExit):
        _script("bench_modernbert").main(["--workloads", "var9999"])
