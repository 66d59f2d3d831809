"""The C++ kernels run without the GIL: while one thread is inside a kernel, the other Python
threads run (a server's event loop beside its model thread). Checked without timing thresholds: a
thread that sleeps through the start of one long kernel call in another thread must wake before that
kernel returns, which it cannot do if the kernel holds the GIL."""
import threading
import time

import pytest
import torch

from fastbert.backend import cpp_extension
from tests.helpers.backends import require


def _timed(call, started: threading.Event, times: dict) -> None:
    started.set()
    times["entered"] = time.perf_counter()
    call()
    times["returned"] = time.perf_counter()


def woke_inside(call, tries: int = 5) -> bool:
    """Run call() (one kernel call of tens of ms or more) in a thread; True when this thread, asleep
    5 ms after starting it, ran Python again after the call began and before it returned. A try in
    which this thread woke before the other began the call (a loaded machine can hold a thread back
    that long) tells nothing, and is run again."""
    for _ in range(tries):
        started, times = threading.Event(), {}
        t = threading.Thread(target=_timed, args=(call, started, times))
        t.start()
        started.wait()
        time.sleep(0.005)
        woke = time.perf_counter()
        t.join()
        if woke > times["entered"]:
            return woke < times["returned"]
    pytest.fail(f"the kernel call never began within 5 ms of its thread's start in {tries} tries")


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


def test_a_whole_encoder_layer_runs_without_the_gil(ext):
    # BERT-base's layer on 2048 packed tokens, fp32 and int8: about 100 ms or more each
    from fastbert.ops import quantize_rows, quantize_weight

    g = torch.Generator().manual_seed(0)
    h, f, tokens = 768, 3072, 2048
    shapes = [(3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (f, h), (f,), (h, f), (h,), (h,), (h,)]
    w = [torch.randn(*s, generator=g) * 0.02 for s in shapes]
    x = torch.randn(tokens, h, generator=g)
    cu = torch.tensor([0, tokens // 2, tokens], dtype=torch.int32)
    assert woke_inside(lambda: ext.encoder_layer_forward(x, w, [0, 0, 0, 0], 12, 1e-12, 1e-12, "none",
                                                         cu_seqlens=cu, max_seqlen=tokens // 2))
    q = {i: quantize_weight(w[i]) for i in (0, 2, 6, 8)}
    w8 = [*q[0], w[1], *q[2], w[3], w[4], w[5], *q[6], w[7], *q[8], w[9], w[10], w[11]]
    assert woke_inside(lambda: ext.int8_encoder_layer_forward(x, *quantize_rows(x), w8, [2, 2, 2, 2], 12, 1e-12,
                                                              1e-12, "none", cu, tokens // 2))
