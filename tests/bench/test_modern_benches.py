"""The newer encoders' benchmarks run end to end at a tiny size and check their own answers: the
fused model's outputs against transformers' and, with the peers, against ONNX Runtime's and
OpenVINO's on the model exported once to ONNX (bench_modernbert), and the rows they report; and
bench_int8_glu, their gated feed-forward's int8 pass."""
import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(module, tmp_path, *args):
    """(rows, the JSON written) of module.main(--rounds 1 --workloads small, *args)."""
    out = tmp_path / "rows.json"
    module.main(["--rounds", "1", "--workloads", "small", *args, "--json", str(out)])
    data = json.loads(out.read_text())
    return data["rows"], data


@pytest.mark.slow
@pytest.mark.parametrize("model", ["modernbert", "mpnet"])
def test_bench_modernbert_runs_and_agrees_with_transformers(tmp_path, model, capsys):
    out = tmp_path / "rows.json"
    _script("bench_modernbert").main(["--model", model, "--layers", "1", "--rounds", "1", "--workloads", "var128",
                                      "--peers", "", "--in-process", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["workload"] for r in rows] == ["var128"]
    assert rows[0]["max_abs_err"] < 1e-4 and rows[0]["speedup"] > 0
    assert set(rows[0]["ms"]) == {"fastbert", "transformers"}
    assert rows[0]["gflop"] > 0 and rows[0]["floor_ms"] == rows[0]["gflop"] / rows[0]["gemm"]["gflops"] * 1e3
    out = capsys.readouterr().out
    assert "var128" in out and "# var128: " in out and "of the GEMM rate" in out and "in this process" in out


@pytest.mark.slow
@pytest.mark.peers
def test_by_default_each_engine_runs_alone_in_its_own_process_and_agrees(tmp_path, monkeypatch, capsys):
    """Without --in-process every engine (fastbert, transformers, ONNX Runtime and OpenVINO on the file
    exported once here) is built and timed in a child process of its own, two passes of --rounds
    calls; the outputs the children send back agree, and the temporary directories are gone."""
    for package in ("onnxruntime", "openvino"):
        pytest.importorskip(package, reason=f"{package} is not installed (the peers extra: pip install -e .[peers])")
    import tempfile

    made, real = [], tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **kw: made.append(real(*a, **kw)) or made[-1])
    module = _script("bench_modernbert")
    children = []
    runs = module.isolated_engine_runs
    monkeypatch.setattr(module, "isolated_engine_runs", lambda *a, **kw: children.append(a[3]) or runs(*a, **kw))
    rows, data = _rows(module, tmp_path, "--model", "modernbert", "--layers", "2")
    assert children == [["fastbert", "transformers", "onnxruntime", "openvino"]]
    assert len(made) == 2 and not any(os.path.exists(d) for d in made)
    (row,) = rows
    assert data["peers_skipped"] == {} and row["disagree"] == []
    assert set(row["errors"]) == {"transformers", "onnxruntime", "openvino"}
    assert all(e < 1e-4 for e in row["errors"].values()), row["errors"]
    assert set(row["ms"]) == {"fastbert", *row["errors"]} and all(v > 0 for v in row["speedup_vs"].values())
    assert "each engine alone in a process of its own, two passes of 1 calls" in capsys.readouterr().out


def test_an_isolated_engine_that_disagrees_is_reported_and_its_times_left_out(tmp_path, monkeypatch, capsys):
    """The children's outputs are judged as the in-process ones: a peer beyond the tolerance is said
    and its times are not in the row."""
    module = _script("bench_modernbert")

    def runs(model, layers, dtype, engines, batches, onnx, trace, calls):
        real = {w: mask.bool() for w, (_, mask) in batches.items()}
        right = {w: torch.ones(int(r.sum()), 768) for w, r in real.items()}
        outs = {"fastbert": right, "transformers": {w: v.clone() for w, v in right.items()},
                "onnxruntime": {w: v * 0 for w, v in right.items()}}
        return outs, {e: {w: [0.01, 0.02] for w in batches} for e in outs}, {}

    monkeypatch.setattr(module, "isolated_engine_runs", runs)
    monkeypatch.setattr(module, "export_for", lambda hf, ids, mask, peers, path: (path, {}))
    monkeypatch.setattr(module, "onnx_skips", lambda peers, dtype: {})
    rows, _ = _rows(module, tmp_path, "--layers", "1", "--peers", "onnxruntime")
    (row,) = rows
    assert row["disagree"] == ["onnxruntime"] and row["errors"] == {"transformers": 0.0, "onnxruntime": 1.0}
    assert set(row["ms"]) == {"fastbert", "transformers"} and row["speedup"] == 1.0
    assert "onnxruntime disagrees with fastbert on small: max abs err 1.00e+00, least cosine 0.0000; its times " \
           "left out" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.parametrize("model,layers", [("modernbert", 2), ("mpnet", 1)])
def test_bench_modernbert_peers_run_the_exported_model_and_agree(tmp_path, monkeypatch, model, layers, capsys):
    """ONNX Runtime and OpenVINO run the model exported once (its temporary directory gone when the
    engines are built), on padded batches with their mask; every engine's output agrees with
    fastbert's and every engine is timed. ModernBERT at 2 layers: the second one is a sliding layer,
    and the small workload's sequences (40..160 tokens) are longer than its 64-token window."""
    for package in ("onnxruntime", "openvino"):
        pytest.importorskip(package, reason=f"{package} is not installed (the peers extra: pip install -e .[peers])")
    from fastbert.bench import peers

    made, real = [], peers.tempfile.mkdtemp
    monkeypatch.setattr(peers.tempfile, "mkdtemp", lambda **kw: made.append(real(**kw)) or made[-1])
    rows, data = _rows(_script("bench_modernbert"), tmp_path, "--model", model, "--layers", str(layers), "--in-process")
    assert len(made) == 1 and not os.path.exists(made[0])
    assert data["peers_skipped"] == {}
    (row,) = rows
    assert set(row["errors"]) == {"transformers", "onnxruntime", "openvino"}
    assert all(e < 1e-4 for e in row["errors"].values()), row["errors"]
    assert row["disagree"] == [] and set(row["ms"]) == {"fastbert", *row["errors"]}
    assert all(v > 0 for v in row["speedup_vs"].values())
    header = capsys.readouterr().out
    assert "onnxruntime ms" in header and "vs openvino" in header


@pytest.mark.slow
@pytest.mark.parametrize("dtype, against", [("float32", "fastbert"), ("int8", "transformers fp32")])
def test_a_peer_that_disagrees_is_reported_and_not_timed(tmp_path, monkeypatch, capsys, dtype, against):
    module = _script("bench_modernbert")

    def wrong(theirs, ids, mask, wanted, dtype):
        return {"onnxruntime": lambda i, m: torch.zeros(*i.shape, theirs.config.hidden_size)}, {}

    monkeypatch.setattr(module, "onnx_peers", wrong)
    rows, _ = _rows(module, tmp_path, "--layers", "1", "--peers", "onnxruntime", "--dtype", dtype, "--in-process")
    (row,) = rows
    assert row["disagree"] == ["onnxruntime"] and row["errors"]["onnxruntime"] > 0.1
    assert set(row["ms"]) == {"fastbert", "transformers"} and "onnxruntime" not in row["speedup_vs"]
    assert f"onnxruntime disagrees with {against} on small" in capsys.readouterr().out  # and "not timed"


@pytest.mark.slow
@pytest.mark.peers
def test_int8_times_fastbert_and_the_int8_peers_against_transformers_fp32(tmp_path, capsys):
    """--dtype int8: fastbert's int8 model, ONNX Runtime's dynamic quantization of the same export and
    (where openvino and nncf are installed) OpenVINO's NNCF quantization of it, each compared with
    transformers' fp32 output (not exact, close), all timed; OpenVINO skipped with its reason where
    NNCF is missing."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the peers extra: pip install -e .[peers])")
    openvino = all(importlib.util.find_spec(p) is not None for p in ("openvino", "nncf"))
    peers = {"onnxruntime"} | ({"openvino"} if openvino else set())
    rows, data = _rows(_script("bench_modernbert"), tmp_path, "--layers", "2", "--dtype", "int8", "--in-process")
    assert data["machine"]["dtype"] == "int8" and ("openvino" in data["peers_skipped"]) != openvino
    (row,) = rows
    assert set(row["ms"]) == {"fastbert", "transformers"} | peers and row["disagree"] == []
    assert set(row["errors"]) == {"fastbert"} | peers and row["errors"]["fastbert"] > 0
    assert row["least_cosine"]["fastbert"] > 0.99, row["least_cosine"]
    assert all(row["least_cosine"][p] > 0.9 for p in peers), row["least_cosine"]
    out = capsys.readouterr().out
    assert "fastbert int8's own: small" in out and "vs onnxruntime" in out


@pytest.mark.slow
@pytest.mark.peers
def test_bf16_runs_the_models_in_bf16_and_skips_onnx_runtime(tmp_path, capsys):
    """--dtype bfloat16: fastbert's and transformers' models in bf16, agreeing within bf16's rounding;
    ONNX Runtime skipped with its reason; OpenVINO at bf16 precision where it loads (a CPU without
    native bf16 may refuse: then skipped with the reason)."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the peers extra: pip install -e .[peers])")
    rows, data = _rows(_script("bench_modernbert"), tmp_path, "--layers", "1", "--dtype", "bfloat16", "--in-process")
    assert data["machine"]["dtype"] == "bfloat16"
    assert "fp32" in data["peers_skipped"]["onnxruntime"]
    (row,) = rows
    assert "onnxruntime" not in row["ms"] and 0 < row["errors"]["transformers"] < 0.5
    assert "openvino" in row["ms"] or "openvino" in data["peers_skipped"]
    assert row["disagree"] == []


@pytest.mark.slow
def test_a_missing_peer_is_skipped_with_its_reason(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    rows, data = _rows(_script("bench_modernbert"), tmp_path, "--layers", "1", "--peers", "openvino", "--in-process")
    assert "pip install -e .[peers]" in data["peers_skipped"]["openvino"]
    assert set(rows[0]["ms"]) == {"fastbert", "transformers"}
    captured = capsys.readouterr()
    assert "peer skipped: openvino" in captured.err and "openvino ms" not in captured.out


def test_bench_modernbert_refuses_an_unknown_workload_or_peer():
    for args in (["--workloads", "var9999"], ["--peers", "ctranslate2"]):
        with pytest.raises(SystemExit):
            _script("bench_modernbert").main(args)


def test_bench_int8_glu_times_the_fused_gate_against_the_composed_ops(tmp_path, capsys):
    """bench_int8_glu (the gated families' int8 feed-forward): both paths agree before they are timed,
    and the row has each one's time and the ratios."""
    out = tmp_path / "rows.json"
    _script("bench_int8_glu").main(["--rows", "5", "--gate", "silu", "--rounds", "1", "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["rows"] == 5 and row["gate"] == "silu"
    assert set(row["ms"]) == {"composed fp32", "composed bf16", "int8_glu"} and all(v > 0 for v in row["ms"].values())
    assert set(row["speedup"]) == {"composed fp32", "composed bf16"}
    assert "| 5 | [2 x 3072] | silu |" in capsys.readouterr().out
