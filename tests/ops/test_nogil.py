"""The C++ kernels run without the GIL: while one thread is inside a kernel, the other Python
threads run (a server's event loop beside its model thread). Checked without timing thresholds: a
thread that sleeps through the start of one long kernel call in another thread must wake before that
kernel returns, which it cannot do if the kernel holds the GIL."""
import threading
import time

import pytest
import torch
from conftest import require

from fastbert.backend import cpp_extension


def woke_inside(call) -> bool:
    """Run call() (one kernel call of tens of ms or more) in a thread; True when this thread, asleep
    5 ms after starting it, ran Python again before the call returned."""
    started, times = threading.Event(), {}

    def worker():
        started.set()
        call()
        times["returned"] = time.perf_counter()

    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    time.sleep(0.005)
    woke = time.perf_counter()
    t.join()
    return woke < times["returned"]


@pytest.fixture(scope="module")
def ext():
    require("cpp")
    return cpp_extension()


def test_a_call_that_holds_the_gil_is_seen(ext):
    # the check can fail: pad_id_lists reads Python lists, so it holds the GIL throughout
    rows = [list(range(400))] * 50000
    assert not woke_inside(lambda: ext.pad_id_lists(rows, 512, 0))


def test_attention_runs_without_the_gil(ext):
    # about 29 GFLOP: a fraction of a second or more
    q = torch.randn(1, 12, 3072, 64)
    assert woke_inside(lambda: ext.attention_forward(q, q, q, None, 0.125, 0.0, 0, False))


def test_the_int8_gemm_and_the_fused_ops_run_without_the_gil(ext):
    # one call each, of tens of milliseconds or more (64M elements; 34G multiply-adds)
    a = torch.randint(-127, 128, (2048, 4096), dtype=torch.int8)
    assert woke_inside(lambda: ext.int8_gemm(a, torch.randint(-127, 128, (4096, 4096), dtype=torch.int8)))
    x, w = torch.randn(8192, 8192), torch.ones(8192)
    assert woke_inside(lambda: ext.add_layer_norm_forward(x, x, w, w, 1e-5))
    assert woke_inside(lambda: ext.bias_gelu_forward(x, w))
