"""The encoder benchmark's table: the floor named by its GEMM path, each provider's error against
transformers in fp32, and the peers: converted and checked where installed, skipped with a reason
where not."""
import importlib.util

import pytest
import torch

from fastbert.bench import encoder, peers
from fastbert.ops import gemm


@pytest.mark.slow
def test_table_names_the_floor_path_and_measures_errors():
    rows = encoder.run(["var128"], [torch.float32], layers=1, rounds=1, progress=False)
    by_name = {r["provider"]: r for r in rows}
    floor = by_name["GEMM floor fp32"]
    assert floor["picked"] in (*gemm.PATHS, "per-shape")
    assert floor["vs_floor"] == pytest.approx(1.0)
    fb = by_name["fastbert fp32"]
    assert fb["vs_floor"] > 0 and fb["vs_sdpa"] > 0 and fb["vs_peer"] is None
    assert fb["max_abs_err"] < 1e-3 and by_name["transformers sdpa fp32"]["max_abs_err"] == 0


def test_a_missing_peer_is_skipped_with_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else real(name, *a))
    provs, skipped = peers.peer_providers(None, None, None, [torch.float32], peers=("ctranslate2",))
    assert provs == {} and "pip install -e .[peers]" in skipped["ctranslate2 fp32"]


def test_a_failing_conversion_is_skipped_with_its_error(monkeypatch, capsys):
    def fails(*args):
        raise RuntimeError("unsupported operator aten::foo\nmore detail")

    monkeypatch.setitem(peers.BUILD, "torch.compile", fails)
    provs, skipped = peers.peer_providers(None, None, None, [torch.float32], peers=("torch.compile",))
    assert provs == {}
    assert skipped["torch.compile fp32"] == "conversion failed: RuntimeError: unsupported operator aten::foo"
    assert "peer skipped: torch.compile fp32" in capsys.readouterr().err


def _tiny_bert():
    """(transformers' BertModel of 2 small layers, ids, mask) for the peers' conversions."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, attn_implementation="sdpa")
    mask = (torch.arange(12)[None] < torch.tensor([12, 5, 9])[:, None]).long()
    return transformers.BertModel(cfg).eval(), torch.randint(1, 200, (3, 12)) * mask, mask


def _installed_peer_output(peer, dtype, tag):
    """(the peer's last hidden state in `dtype`, transformers' fp32 one, the real-token mask) on the
    tiny model; skipped when the peer is not installed."""
    if importlib.util.find_spec(peer) is None:
        pytest.skip(f"{peer} is not installed (the peers extra: pip install -e .[peers])")
    hf, ids, mask = _tiny_bert()
    provs, skipped = peers.peer_providers(hf, ids, mask, [dtype], peers=(peer,))
    assert not skipped, skipped
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    return provs[f"{peer} {tag}"](), want, mask.bool()


@pytest.mark.peers
@pytest.mark.parametrize("peer", ["onnxruntime", pytest.param("openvino", marks=pytest.mark.slow), "ctranslate2"])
def test_each_installed_peer_computes_the_model(peer):
    got, want, real = _installed_peer_output(peer, torch.float32, "fp32")
    assert got.shape == want.shape
    assert (got[real] - want[real]).abs().max() < 1e-4


@pytest.mark.peers
@pytest.mark.parametrize("peer", ["onnxruntime", pytest.param("openvino", marks=pytest.mark.slow), "ctranslate2"])
def test_each_installed_int8_peer_computes_the_model(peer):
    if peer == "openvino":  # its int8 is NNCF's quantization of the OpenVINO model
        pytest.importorskip("nncf", reason="nncf is not installed (the peers extra: pip install -e .[peers])")
    got, want, real = _installed_peer_output(peer, torch.int8, "int8")
    got = got[real].double().flatten()
    want = want[real].double().flatten()
    assert float(got @ want / got.norm() / want.norm()) > 0.99  # int8: close, not equal


@pytest.mark.slow
def test_the_int8_table_compares_with_fastbert_fp32():
    rows = encoder.run(["var128"], [torch.float32, torch.int8], layers=1, rounds=1, progress=False)
    by_name = {r["provider"]: r for r in rows}
    fb = by_name["fastbert int8"]
    assert fb["vs_fastbert_fp32"] > 0 and by_name["GEMM floor int8"]["vs_floor"] == pytest.approx(1.0)
    assert fb["max_abs_err"] < 0.5
    assert "transformers sdpa int8" not in by_name


def test_cpu_capability_reruns_the_benchmark_with_every_library_capped(monkeypatch):
    """--cpu-capability avx2: the same command again, in a process whose fastbert, torch, MKL, oneDNN
    and CTranslate2 stand for an AVX2 CPU (they read their caps when they load)."""
    import os
    import sys

    from fastbert.bench import timing

    calls = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    monkeypatch.delenv("FASTBERT_CPU_CAPABILITY", raising=False)
    timing.run_at_level("avx2", ["benchmarks/bench_encoder.py", "--cpu-capability", "avx2"])
    (exe, argv, env), = calls
    assert exe == sys.executable and argv == [sys.executable, "benchmarks/bench_encoder.py", "--cpu-capability", "avx2"]
    assert env["FASTBERT_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2" and env["CT2_FORCE_CPU_ISA"] == "AVX2"
    monkeypatch.setenv("FASTBERT_CPU_CAPABILITY", "avx2")
    timing.run_at_level("avx2", ["x"])  # already capped: runs on
    assert len(calls) == 1
    with pytest.raises(SystemExit, match="choose one of"):
        timing.run_at_level("avx1024", ["x"])


@pytest.mark.slow
@pytest.mark.peers
def test_the_exported_models_go_once_the_engines_are_built(monkeypatch):
    """The peers' exports (0.4-1.8 GB each at BERT-base size) are removed when peer_providers
    returns; the engines it built still run."""
    import importlib.util
    import os
    import tempfile

    installed = [p for p in ("onnxruntime", "openvino", "ctranslate2") if importlib.util.find_spec(p) is not None]
    if not installed:
        pytest.skip("no peer is installed (the peers extra: pip install -e .[peers])")
    made, real = [], tempfile.mkdtemp
    monkeypatch.setattr(peers.tempfile, "mkdtemp", lambda **kw: made.append(real(**kw)) or made[-1])
    hf, ids, mask = _tiny_bert()
    provs, skipped = peers.peer_providers(hf, ids, mask, [torch.float32, torch.int8], peers=tuple(installed))
    assert len(made) == 1 and not os.path.exists(made[0])
    assert provs and all(run().shape[:2] == ids.shape for run in provs.values())


def test_the_int8_floor_includes_the_packed_weights():
    """The int8 floor on every int8 path, and on weights stored packed where the kernel is built
    (what int8 layers run where fastbert.ops.int8.int8_layout says packed)."""
    import fastbert
    from fastbert.bench import providers
    from fastbert.bench.workloads import random_transformers_encoder

    model = fastbert.hf.from_transformers(random_transformers_encoder(1, "sdpa", "bert")).eval()
    provs = providers.floor_providers(model, 5, torch.int8)
    built = fastbert.backend.cpp_function("int8_gemm_packed") is not None
    assert ("GEMM floor int8 packed" in provs) == built and "GEMM floor int8 per-shape" in provs
    for name, run in provs.items():
        if "onednn_qlinear" not in name:  # seconds on CPUs without VNNI, and not what this test is about
            run()
