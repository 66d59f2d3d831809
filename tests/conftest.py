"""Shared test helpers. Triton kernels run on the CPU through the interpreter when there is no GPU:
TRITON_INTERPRET=1 must be set before triton is imported, so it is set here, first."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from fastbert import backend as fb_backend  # noqa: E402
from fastbert.selfcheck import bound_check, with_grads  # noqa: E402  (the one error bound)


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


def assert_within_bound(name, out, torch_out, ref64, dtype):
    """err(kernel, fp64 ref) <= 2 * err(torch in the same dtype, fp64 ref) + ATOL[dtype] * scale."""
    assert out.shape == ref64.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref64.shape)}"
    assert out.dtype == torch_out.dtype, f"{name}: dtype {out.dtype}, torch gives {torch_out.dtype}"
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    ok, err, bound = bound_check(out, torch_out, ref64, dtype)
    assert ok, f"{name}: err {err:.3e} > bound {bound:.3e}"


def run_with_grads(fn, inputs, grad_out):
    """Call fn(*inputs) on fresh leaf copies; return (output, [grad of each input])."""
    out, *grads = with_grads(fn, inputs, grad_out)
    return out, grads


@pytest.fixture(params=["torch", "cpp", "triton"])
def backend(request):
    require(request.param)
    return request.param


# ---------------------------------------------------------------------------------------------
# pretraining tests (tests/pretraining): one tiny prepared corpus per session, one thread


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "pretraining"))
    from pretraining_helpers import make_tiny_data

    return make_tiny_data(str(tmp_path_factory.mktemp("tiny_data")))


@pytest.fixture(autouse=True)
def _one_thread_in_pretraining_tests(request):
    """The pretraining models are tiny: one thread runs them as fast as two, and far faster when
    the cores are shared with other work."""
    if "pretraining" not in str(request.node.fspath):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
