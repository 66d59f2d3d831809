"""The `fastbert` command and the op benchmark, at sizes that run in seconds."""
import importlib.util
import json
import os

import pytest
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


@pytest.mark.slow
def test_selfcheck_covers_every_op_and_passes_on_every_backend_here():
    import fastbert

    small = list(selfcheck.cases("cpu", True))
    covered = {op for op, _, _ in small} | {"unpad", "pad", "masking", "LayerWeights"}
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
    assert len(rows) == 2 * len(bench.OPS)  # every op, forward and backward
    assert {r["op"] for r in rows} == {"bias_gelu", "geglu", "swiglu", "add_layer_norm"}
    for r in rows:
        assert r["speedup"] > 0 and all(v > 0 for v in r["ms"].values())
        assert 0 < r["roofline_ms"] < float("inf")  # the bytes it moves at this machine's measured bandwidth
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
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], proc.stderr
    return lines[0]


@pytest.mark.slow
def test_cli_errors_are_one_line_on_stderr(tmp_path):
    text = tmp_path / "lines.txt"
    text.write_text("a sentence\n")
    cases = [
        (("encode", "/no/such/dir", "--input", str(text), "--output", str(tmp_path / "e.npy")), 1,
         "model directory /no/such/dir does not exist"),
        (("encode", str(text), "--input", str(text), "--output", str(tmp_path / "e.npy")), 1, "is not a directory"),
        (("encode", str(tmp_path), "--input", str(tmp_path / "missing.txt"), "--output", "e.npy"), 1,
         f"input file {tmp_path / 'missing.txt'} does not exist"),
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


def test_cli_unknown_command_is_one_line_on_stderr():
    proc = _cli("no-such-command")
    assert proc.returncode == 2 and proc.stdout == ""
    line = _one_error_line(proc)
    assert line.startswith("fastbert: error: unknown command 'no-such-command' (choose from selfcheck, "), line


def _run(capsys, *args):
    """(exit status, stdout, stderr) of `fastbert ARGS` run in this process (argparse's exits caught)."""
    try:
        code = cli.main(list(args))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_command_reports_a_bad_input_on_one_line_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FASTBERT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)  # anything a command writes before it stops lands here
    missing = str(tmp_path / "nonexistent")
    cases = [
        (("frobnicate",), "fastbert", 2, "unknown command 'frobnicate' (choose from selfcheck, encode, rerank"),
        (("bench", "--dtype", "fp64"), "bench", 2, "unknown dtype 'fp64'"),
        (("encode", missing, "--input", "x", "--output", "y"), "encode", 1, f"model directory {missing} does not exist"),
        (("encode", str(tmp_path), "--input", "x", "--output", "y"), "encode", 1, "input file x does not exist"),
        (("rerank", missing, "--query", "q"), "rerank", 1, f"model directory {missing} does not exist"),
        (("pretrain", "--corpus", missing), "pretrain", 2, f"corpus path {missing} does not exist"),
        (("prepare", missing, "--out", "o"), "prepare", 2, f"corpus path {missing} does not exist"),
        (("attention-map", "--model", missing, "--text", "t", "-o", "m.png"), "attention-map", 1,
         f"model directory {missing} does not exist"),
        (("attention-map",), "attention-map", 2, "the following arguments are required: --model, --text, -o/--output"),
        (("serve", missing), "serve", 1, f"model directory {missing} does not exist"),
        (("serve", str(tmp_path), "--port", "70000"), "serve", 2, "--port must be in 0..65535, got 70000"),
        (("selfcheck", "--no-such-flag"), "selfcheck", 2, "unrecognized arguments: --no-such-flag"),
        (("embed", missing, "--input", "x", "--output", "y"), "embed", 1, f"model directory {missing} does not exist"),
        (("embed",), "embed", 2, "the following arguments are required: model"),
    ]
    for args, command, code, words in cases:
        got, out, err = _run(capsys, *args)
        prefix = "fastbert: error: " if command == "fastbert" else f"fastbert {command}: error: "
        lines = err.splitlines()
        assert got == code and len(lines) == 1 and err.endswith("\n"), (args, got, err)
        assert lines[0].startswith(prefix) and words in lines[0], (args, err)
        assert lines[0].count("error:") == 1 and "error: fastbert" not in lines[0], (args, err)
        assert "usage:" not in out + err, (args, out)
    assert os.listdir(tmp_path) == []


def test_help_still_prints_the_whole_usage_on_stdout(capsys):
    for command in ("encode", "serve", "attention-map", "bench"):
        code, out, err = _run(capsys, command, "--help")
        assert code == 0 and out.startswith(f"usage: fastbert {command} ") and err == "", (command, out, err)


def test_error_messages_lose_the_prefixes_the_line_already_has():
    assert cli.message(ValueError("fastbert prepare: corpus path x does not exist")) == "corpus path x does not exist"
    assert cli.message("error: fastbert.SentenceEncoder.encode: batch_size must be >= 1") == "batch_size must be >= 1"
    assert cli.message(RuntimeError("fastbert: x is not a directory\nmore")) == "x is not a directory"
    assert cli.message(RuntimeError("fastbert needs matplotlib: pip install it")) == "fastbert needs matplotlib: pip install it"
    assert cli.message(KeyError()) == "KeyError"
