"""Backend selection: the one place that knows which implementations are present.

Every op in `fastbert.ops` runs on one of three backends (see DESIGN.md):
  "triton"  CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 was set before triton was imported
  "cpp"     CPU tensors, the fused C++ kernels of the extension fastbert._C
  "torch"   anywhere, the reference layers of fastbert.reference
Optional imports (triton, the extension) are guarded here and nowhere else.
"""
from __future__ import annotations

import importlib
import os
import warnings
from typing import Optional

import torch

BACKENDS = ("triton", "cpp", "torch")


_UNKNOWN = object()
_cpp = _UNKNOWN
_triton = _UNKNOWN


def cpp_extension():
    """The compiled extension fastbert._C, or None (with one warning) when it was not built."""
    global _cpp
    if _cpp is _UNKNOWN:
        try:
            from fastbert import _C as ext
        except ImportError as exc:
            warnings.warn(
                f"fastbert: the C++ extension fastbert._C is not available ({exc}); CPU ops fall back to "
                "the 'torch' backend. Rebuild with: pip install --no-build-isolation -e .",
                RuntimeWarning,
                stacklevel=3,
            )
            ext = None
        _cpp = ext
    return _cpp


def triton_available() -> bool:
    """True when triton imports (it is optional: CPU-only installs need not have it)."""
    global _triton
    if _triton is _UNKNOWN:
        try:
            import triton  # noqa: F401

            _triton = True
        except Exception:
            _triton = False
    return _triton


def triton_interpreting() -> bool:
    """True when triton runs kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve(backend: Optional[str], t: torch.Tensor) -> str:
    """The backend that runs an op on tensor `t`: `backend` checked, or the automatic choice."""
    if backend is None:
        backend = os.environ.get("FASTBERT_BACKEND") or None
    if backend is None:
        if t.is_cuda:
            return "triton" if triton_available() else "torch"
        return "cpp" if cpp_extension() is not None else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"fastbert: unknown backend {backend!r}; choose one of {BACKENDS} or None")
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("fastbert: backend='triton' needs the triton package (pip install triton)")
        if not t.is_cuda and not (t.device.type == "cpu" and triton_interpreting()):
            raise RuntimeError(
                f"fastbert: backend='triton' got tensors on {t.device}; it needs CUDA tensors, or "
                "TRITON_INTERPRET=1 set in the environment before triton is imported to run the "
                "kernels on the CPU through the interpreter"
            )
    elif backend == "cpp":
        if t.device.type != "cpu":
            raise RuntimeError(f"fastbert: backend='cpp' runs on CPU tensors, got tensors on {t.device}")
        if cpp_extension() is None:
            raise RuntimeError(
                "fastbert: backend='cpp' asked for but the C++ extension fastbert._C is not built; "
                "reinstall with: pip install --no-build-isolation -e ."
            )
    return backend


def cpp_available() -> bool:
    """True when the extension is built (it warns once when it is not)."""
    return cpp_extension() is not None


_predates = set()


def cpp_function(name: str):
    """The extension's function `name`, or None when the extension is not built or predates it
    (then with one warning per function)."""
    ext = cpp_extension()
    if ext is None:
        return None
    fn = getattr(ext, name, None)
    if fn is None and name not in _predates:
        _predates.add(name)
        warnings.warn(
            f"fastbert: the built extension fastbert._C predates {name}; it runs in plain PyTorch. "
            "Rebuild with: pip install --no-build-isolation -e .",
            RuntimeWarning,
            stacklevel=3,
        )
    return fn


def impl(backend: str, kernel_module: str):
    """The module holding the `<op>_forward` / `<op>_backward` launchers of a fused backend:
    the extension for "cpp", fastbert.kernels.<kernel_module> for "triton"."""
    if backend == "cpp":
        return cpp_extension()
    if backend == "triton":
        return importlib.import_module(f"fastbert.kernels.{kernel_module}")
    raise AssertionError(f"no fused launchers for backend {backend!r}")
