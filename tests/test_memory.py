"""The C++ extension's allocator for large CPU outputs (fastbert._C.empty) and the inference
linear layers that write into it (fastbert.ops.linear); freed heap memory given back to the system
(fastbert.memory)."""
import pytest
import torch
import torch.nn.functional as F

from fastbert import backend as fb_backend
from fastbert import memory, ops
from fastbert.ops import gemm
from tests.helpers.backends import require


@pytest.fixture
def ext():
    require("cpp")
    ext = fb_backend.cpp_extension()
    ext.release_cached_memory()
    yield ext
    ext.release_cached_memory()


@pytest.mark.parametrize("shape", [(3, 5), (1024, 1024), (2, 700, 1536)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_gives_a_usable_contiguous_tensor(ext, shape, dtype):
    t = ext.empty(list(shape), dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
    t.fill_(3)
    assert (t == 3).all()
    t.resize_(0)  # its storage is resizable like any CPU tensor's


def _require_mapping_allocator():
    import os
    import platform
    import sys

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc" or os.environ.get("FASTBERT_THP") == "0":
        pytest.skip("large outputs come from the mapping allocator only on Linux with glibc's malloc")


def test_freed_large_blocks_serve_requests_up_to_twice_smaller(ext):
    _require_mapping_allocator()
    big = ext.empty([1024, 4096], torch.float32)  # 16 MiB
    ptr = big.data_ptr()
    big.fill_(1)
    del big
    smaller = ext.empty([1024, 2500], torch.float32)  # 9.8 MiB: the freed mapping serves it
    assert smaller.data_ptr() == ptr
    del smaller
    again = ext.empty([1024, 4096], torch.float32)
    assert again.data_ptr() == ptr
    del again
    much_smaller = ext.empty([1024, 1100], torch.float32)  # 4.3 MiB: under half of it, a mapping of its own
    assert much_smaller.data_ptr() != ptr


def test_the_kept_mappings_never_outgrow_the_most_ever_in_use(ext):
    """A loop that meets a new size at every step (a server seeing every batch shape) keeps at most
    the bytes its largest step had in use at once, not a mapping per size up to the 1 GiB cap."""
    _require_mapping_allocator()
    mib = 1 << 20
    base = ext.cached_memory()["in_use"]  # what other tests' live tensors hold
    step = [ext.empty([8 * mib], torch.uint8), ext.empty([10 * mib], torch.uint8)]  # the largest step: 18 MiB
    assert ext.cached_memory()["in_use"] == base + 18 * mib
    assert ext.cached_memory()["peak_in_use"] >= base + 18 * mib
    del step
    largest = 0
    for size in range(8, 90):  # 82 sizes of 4..44.5 MiB, one at a time: a new size at every step
        t = ext.empty([size * mib // 2 + 4096], torch.uint8)
        t.fill_(1)
        largest = max(largest, -(-t.numel() // (2 * mib)) * 2 * mib)  # in whole 2 MiB pages
        del t
        stats = ext.cached_memory()
        assert stats["in_use"] == base and stats["cached"] <= stats["peak_in_use"], stats
    stats = ext.cached_memory()
    assert stats["peak_in_use"] == base + max(18 * mib, largest)
    assert 0 < stats["cached"] <= base + largest < 64 * mib  # not the 82 sizes' 2 GiB, nor the 1 GiB cap
    ext.release_cached_memory()
    assert ext.cached_memory()["cached"] == 0 and ext.cached_memory()["peak_in_use"] == base


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_linear_into_the_allocator_matches_f_linear(ext, bias, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1500, 384, generator=g).to(dtype)  # 2 x 1500 x 1536 outputs: over 4 MiB
    w = torch.randn(1536, 384, generator=g).to(dtype)
    b = torch.randn(1536, generator=g).to(dtype) if bias else None
    with torch.no_grad(), gemm.forced("addmm"):  # the path that writes into the allocator's memory
        out = ops.linear(x, w, b)
        torch.testing.assert_close(out, F.linear(x, w, b), atol=0, rtol=0)
    # under autograd the products run on their own paths (tests/ops/test_linear.py checks the values)
    xg = x.clone().requires_grad_(True)
    out = ops.linear(xg, w, b)
    out.float().sum().backward()
    assert xg.grad is not None and out.requires_grad


def test_trim_gives_the_free_pages_inside_the_heap_back():
    """200 blocks of 1 MiB freed below one still in use: malloc keeps them resident (only a heap's
    top goes back by itself); trim_now hands their pages back."""
    _require_mapping_allocator()  # Linux with glibc's malloc
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(8 << 20))  # a mapped block freed: malloc takes blocks of this size from its heap since
    blocks = [libc.malloc(1 << 20) for _ in range(200)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks[:-1]:
        libc.free(b)
    before = memory.resident_mib()
    assert memory.trim_now()
    after = memory.resident_mib()
    libc.free(blocks[-1])
    assert before - after > 100, (before, after)


def test_a_trimmer_trims_at_most_once_a_period(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "trim_now", lambda: calls.append(1) or True)
    clock = [100.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: clock[0])
    trim = memory.Trimmer(every=10.0)
    assert not trim() and calls == []  # the period counts from its start
    clock[0] += 9.9
    assert not trim()
    clock[0] += 0.2
    assert trim() and calls == [1]
    clock[0] += 5
    assert not trim() and calls == [1]
    clock[0] += 5
    assert trim() and calls == [1, 1]
