"""Which backends run here: a test asks for one with require(), which skips it when the backend is
missing (or fails it, in CI); device_for() is where its tensors go."""
import os

import pytest
import torch

from fastbert import backend as fb_backend

BACKENDS = ["torch", "cpp", "triton"]


def backend_missing(backend):
    """Why `backend` cannot run here, or None when it can."""
    if backend == "cpp" and fb_backend.cpp_extension() is None:
        return "the C++ extension fastbert._C is not built"
    if backend == "triton":
        if not fb_backend.triton_available():
            return "triton is not installed"
        if not torch.cuda.is_available() and not fb_backend.triton_interpreting():
            return "no CUDA device and TRITON_INTERPRET is not 1"
    return None


def require(backend):
    """Skip when `backend` is unavailable, unless FASTBERT_REQUIRE_ALL_BACKENDS=1 (CI): then fail."""
    why = backend_missing(backend)
    if why is None:
        return
    if os.environ.get("FASTBERT_REQUIRE_ALL_BACKENDS") == "1":
        pytest.fail(f"backend {backend!r} is required here but unavailable: {why}")
    pytest.skip(f"backend {backend!r} unavailable: {why}")


def device_for(backend):
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def dtypes_for(backend):
    # the interpreter has no bfloat16 matrix product; fp32 and fp16 are what it checks
    return [torch.float32, torch.float16] if backend == "triton" else [torch.float32, torch.float16, torch.bfloat16]
