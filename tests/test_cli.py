"""The `fastbert` command and the op benchmark, at sizes that run in seconds."""
import importlib.util
import json
import os

import torch

from fastbert import cli, selfcheck


def test_cli_help_and_unknown_command(capsys):
    assert cli.main(["--help"]) == 0
    assert "selfcheck" in capsys.readouterr().out
    assert cli.main(["no-such-command"]) == 2


def test_selfcheck_cases_pass_on_every_backend_here():
    for backend in selfcheck.available_backends("cpu"):
        interpreted = backend == "triton"
        op, shape, dtype = next(c for c in selfcheck.cases("cpu", interpreted) if c[0] == "add_layer_norm")
        for name, ok, err, bound in selfcheck.check_case(op, shape, dtype, backend, "cpu"):
            assert ok, (backend, name, err, bound)


def test_selfcheck_covers_every_op_and_passes_on_every_backend_here():
    import fastbert

    small = list(selfcheck.cases("cpu", True))
    covered = {op for op, _, _ in small} | {"unpad", "pad", "masking"}
    public = {name for name in fastbert.ops.__all__ if name != "MAX_HIDDEN"} | {"mask_tokens"}
    assert public <= covered, public - covered
    for backend in selfcheck.available_backends("cpu") + ["auto"]:
        for op, shape, dtype in small:
            if backend not in selfcheck.op_backends(op, "cpu"):
                continue
            for name, ok, err, bound in selfcheck.check_case(op, shape, dtype, backend, "cpu"):
                assert ok, (backend, op, name, err, bound)


def test_selfcheck_exact_ops_flag_any_difference():
    a = torch.arange(12)
    assert selfcheck.exact_check("x", a, a.clone())[1]
    b = a.clone()
    b[4] = -1
    name, ok, wrong, _ = selfcheck.exact_check("x", b, a)
    assert not ok and wrong == 1
    assert not selfcheck.exact_check("x", a[:5], a)[1]


def test_selfcheck_flags_a_wrong_result():
    ref = torch.randn(64, 64, dtype=torch.float64)
    good = ref.float()
    ok, _, _ = selfcheck.bound_check(good, good, ref, torch.float32)
    assert ok
    bad = good.clone()
    bad[3, 5] += 1e-3
    ok, err, bound = selfcheck.bound_check(bad, good, ref, torch.float32)
    assert not ok and err > bound
    nan = good.clone()
    nan[0, 0] = float("nan")
    assert not selfcheck.bound_check(nan, good, ref, torch.float32)[0]


def test_bench_ops_runs_and_writes_json(tmp_path):
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_ops.py")
    spec = importlib.util.spec_from_file_location("bench_ops", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    providers, rows = bench.run([torch.float32], "cpu", shapes=[(64, 96)], budget_s=0.05, progress=False)
    assert len(rows) == 4  # two ops x forward/backward
    for r in rows:
        assert r["speedup"] > 0 and all(v > 0 for v in r["ms"].values())
    out = tmp_path / "ops.json"
    bench.main(["--dtypes", "float32", "--budget", "0.05", "--json", str(out), "--shapes", "64x96"])
    data = json.loads(out.read_text())
    assert data["rows"] and data["machine"]["torch"] == torch.__version__


def _cli(*args, stdin=None):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "FASTBERT_DEBUG"}
    return subprocess.run([sys.executable, "-m", "fastbert", *args], capture_output=True, text=True, input=stdin,
                          env=env, timeout=300)


def _one_error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith(("usage:", " ", "commands:"))]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and "error" in lines[0], proc.stderr
    return lines[0]


def test_cli_errors_are_one_line_on_stderr(tmp_path):
    text = tmp_path / "lines.txt"
    text.write_text("a sentence\n")
    cases = [
        (("encode", "/no/such/dir", "--input", str(text), "--output", str(tmp_path / "e.npy")), 1, "not a directory"),
        (("encode", "/no/such/dir", "--input", str(tmp_path / "missing.txt"), "--output", "e.npy"), 1, "missing.txt"),
        (("bench", "--dtypes", "fp64"), 2, "unknown dtype 'fp64'"),
        (("bench", "--dtype", "fp64"), 2, "unknown dtype 'fp64'"),  # argparse's prefix of --dtypes
        (("bench", "--workloads", "nope"), 2, "unknown workloads"),
        (("pretrain", "--lr", "abc"), 2, "invalid float value"),
        (("selfcheck", "--device", "tpu"), 2, "invalid choice"),
    ]
    for args, code, words in cases:
        proc = _cli(*args)
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
        assert words in _one_error_line(proc), (args, proc.stderr)


def test_cli_unknown_command_prints_usage_on_stderr():
    proc = _cli("no-such-command")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "usage: fastbert COMMAND" in proc.stderr
    assert "unknown command 'no-such-command'" in _one_error_line(proc)
