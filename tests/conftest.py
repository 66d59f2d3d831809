"""Fixtures shared by the whole suite and the hook of the slow_with marker (helpers are in
tests/helpers/). Triton kernels run on the CPU through the interpreter when there is no GPU:
TRITON_INTERPRET=1 must be set before triton is imported, so it is set here, first."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (-n N) the workers share the cores: each takes its share of torch's threads, so
# that N workers of two threads each do not wait on each other's spinning OpenMP threads.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest  # noqa: E402

from tests.helpers.backends import require  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before -m deselects by mark
def pytest_collection_modifyitems(items):
    """@pytest.mark.slow_with("cpp", "triton"): the test's cases whose backend fixture is one of
    those are slow, the others not."""
    for item in items:
        marker = item.get_closest_marker("slow_with")
        callspec = getattr(item, "callspec", None)
        if marker is not None and callspec is not None and callspec.params.get("backend") in marker.args:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=["torch", "cpp", pytest.param("triton", marks=pytest.mark.triton)])
def backend(request):
    require(request.param)
    return request.param


@pytest.fixture
def one_thread():
    """Tiny models: one thread runs them as fast as two, and far faster when the cores are shared
    with other work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """One tiny prepared corpus per session (the pretraining and prepare tests)."""
    from tests.helpers.pretraining import make_tiny_data

    return make_tiny_data(str(tmp_path_factory.mktemp("tiny_data")))
