"""Backend selection: the automatic choice, the fallback when the extension is missing, the errors."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import require

import fastbert


def run_python(code, **env):
    """Run `code` in a fresh interpreter (so import-time state such as TRITON_INTERPRET is clean)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FASTBERT_BACKEND")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=300
    )


def test_import_without_extension_falls_back_to_torch_with_one_warning():
    proc = run_python(
        """
        import sys, warnings
        sys.modules["fastbert._C"] = None          # as if the extension had not been built
        import torch, fastbert
        from fastbert import backend
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x, b = torch.randn(4, 8), torch.randn(8)
            for _ in range(3):
                y = fastbert.ops.bias_gelu(x, b)
                z = fastbert.ops.add_layer_norm(x, x, b, b)
            assert backend.resolve(None, x) == "torch"
        msgs = [str(w.message) for w in caught if "fastbert._C" in str(w.message)]
        assert len(msgs) == 1, msgs
        torch.testing.assert_close(y, fastbert.reference.bias_gelu(x, b))
        print("ok")
        """
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_triton_on_cpu_without_interpreter_is_a_clear_error():
    require("triton")
    proc = run_python(
        """
        import torch, fastbert
        try:
            fastbert.ops.bias_gelu(torch.randn(2, 4), torch.randn(4), backend="triton")
        except RuntimeError as e:
            print("ERR", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    if torch.cuda.is_available():
        return
    assert "ERR" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout and "CUDA" in proc.stdout, proc.stdout


def test_automatic_choice_and_env_override(monkeypatch):
    x = torch.randn(2, 4)
    monkeypatch.delenv("FASTBERT_BACKEND", raising=False)
    expected = "cpp" if fastbert.backend.cpp_extension() is not None else "torch"
    assert fastbert.backend.resolve(None, x) == expected
    monkeypatch.setenv("FASTBERT_BACKEND", "torch")
    assert fastbert.backend.resolve(None, x) == "torch"
    monkeypatch.setenv("FASTBERT_BACKEND", "nope")
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        fastbert.backend.resolve(None, x)


def test_cpp_backend_rejects_non_cpu_tensors_clearly():
    x = torch.randn(2, 4, device="meta")
    with pytest.raises(RuntimeError, match="backend='cpp' runs on CPU tensors"):
        fastbert.backend.resolve("cpp", x)
