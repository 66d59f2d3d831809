"""kernels.Bound's direct launches (kernels.DirectLaunch), checked without a GPU: Triton's JIT is
run for real (the kernel compiled for sm_90 by the wheel's ptxas) against a stand-in driver whose
loaded kernels are numbered and whose launcher records what it is handed. For every call, the
direct path must hand the launcher exactly what the JIT hands it for the same arguments (the
compiled kernel, by its number; the grid, the stream, every parameter in order), and where an
argument's specialization changes (alignment, divisibility by 16, the value 1, a 64-bit size) the
JIT must compile and launch it first. What this cannot check, the launch itself, run_cuda.sh's
kernel tests do on a GPU. The stand-in: fastbert.bench.launch."""
import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.runtime.jit import JITFunction  # noqa: E402

from fastbert.bench.launch import stand_in_driver  # noqa: E402
from fastbert.kernels import Bound, launch  # noqa: E402
from tests.helpers.stand_in import outside_interpreter, script_ends_ok  # noqa: E402


def _idle(hook):
    return hook is None or getattr(hook, "calls", None) == []


def _scaled_copy(X, Y, n, stride_x, scale, offset: tl.int32, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i * stride_x, mask=i < n)
    tl.store(Y + i, x * scale + offset + SHIFT, mask=i < n)


def _biased_copy(X, Y, B, n, BLOCK: tl.constexpr, HAS_B: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n)
    if HAS_B:
        x += tl.load(B + i, mask=i < n)
    tl.store(Y + i, x, mask=i < n)


@pytest.fixture
def stand_in():
    with stand_in_driver() as fake:
        yield fake


def _launch_by_jit(stand_in, kernel, args, options, grid):
    before = len(stand_in.calls)
    kernel.run(*args, grid=grid, warmup=False, **options)
    return stand_in.calls[before:]


def _launch(stand_in, bound, grid, values):
    before = len(stand_in.calls)
    bound(grid, values)
    assert len(stand_in.calls) == before + 1
    return stand_in.calls[-1]


def test_direct_launches_hand_the_launcher_what_the_jit_does(stand_in):
    kernel = stand_in.jit(_scaled_copy)
    options = dict(BLOCK=128, num_warps=4)
    bound = Bound(kernel, (None, None, 0, 1, 0.5, 3), options, ("X", "Y", "n", "stride_x"))
    x = torch.zeros(4096)
    y = torch.zeros(4096)
    cases = [
        (x, y, 1000, 1),      # aligned pointers, n not a multiple of 16
        (x, y, 1000, 1),      # the same specialization again: direct
        (x, y, 1024, 1),      # n % 16 == 0: another kernel
        (x[1:], y, 1000, 1),  # X not 16-byte aligned: another
        (x, y, 1, 1),         # n == 1: the JIT makes it a constant
        (x, y, 96, 2),        # a stride of 2
        (x, y, 2**33, 1),     # a 64-bit n
        (x, y, 1000, 1),      # back to the first: direct, its kernel
    ]
    kept = set()
    for xs, ys, n, stride in cases:
        grid = (triton.cdiv(min(n, 4096), 128),)
        values = {"X": xs, "Y": ys, "n": n, "stride_x": stride}
        want = _launch_by_jit(stand_in, kernel, (xs, ys, n, stride, 0.5, 3), options, grid)
        compiles, loaded = len(kernel.device_caches[0][0]), stand_in.utils.loaded
        key = bound._direct._key(0, kernel.device_caches[0][3], [xs, ys, n, stride, 0.5, 3])
        first = _launch(stand_in, bound, grid, values)
        if key not in kept:  # this Bound's first call of the specialization: the JIT's, kept after
            assert first[6] is not None, f"n={n} stride={stride}: a first call launched directly"
            kept.add(key)
        got = _launch(stand_in, bound, grid, values)
        assert len(kernel.device_caches[0][0]) == compiles and stand_in.utils.loaded == loaded  # nothing new
        assert len(want) == 1 and len(want[0]) == len(got)
        for i, (a, b) in enumerate(zip(want[0], got)):
            if i in (6, 7, 8):  # launch metadata and the enter / exit hooks: for hooks alone, and none is set
                assert b is None and (i == 6 or _idle(a)), f"n={n} stride={stride}: launcher argument {i}"
                continue
            assert a is b or (type(a) is type(b) and a == b), f"n={n} stride={stride}: launcher argument {i}"
    # each specialization compiled once (by the JIT's first call), the first case's reused at the end
    assert len(kept) == len(kernel.device_caches[0][0]) == 6


def test_launch_hands_the_launcher_what_the_jit_does(stand_in):
    # kernels.launch, the launchers' kernel[grid](*args, **options): every argument varies, None
    # ones (which the JIT makes constants) included; keyed on the kernel and its options
    kernel = stand_in.jit(_biased_copy)
    x, y, b = torch.zeros(1024), torch.zeros(1024), torch.zeros(1024)
    cases = [((x, y, b, 1000), dict(BLOCK=64, HAS_B=True)), ((x, y, None, 1000), dict(BLOCK=64, HAS_B=False)),
             ((x[3:], y, b, 992), dict(BLOCK=64, HAS_B=True)), ((x, y, None, 1000), dict(BLOCK=128, HAS_B=False)),
             ((x, y, b, 1000), dict(BLOCK=64, HAS_B=True)), ((x, y, None, 16), dict(BLOCK=64, HAS_B=False))]
    for args, options in cases * 2:
        grid = (triton.cdiv(args[3], options["BLOCK"]),)
        want = _launch_by_jit(stand_in, kernel, args, options, grid)[0]
        before = len(stand_in.calls)
        launch(kernel, grid, args, options)
        launch(kernel, grid, args, options)  # the second of a specialization is direct
        got = stand_in.calls[-1]
        assert len(stand_in.calls) == before + 2 and len(got) == len(want)
        assert got[6] is None, f"{options}: not launched directly"
        for i, (a, b_) in enumerate(zip(want, got)):
            if i not in (6, 7, 8):
                assert a is b_ or (type(a) is type(b_) and a == b_), f"{options}: launcher argument {i}"
    assert len(kernel.device_caches[0][0]) == 5


def test_a_miss_goes_through_the_jit_and_is_kept(stand_in):
    kernel = stand_in.jit(_scaled_copy)
    options = dict(BLOCK=64, SHIFT=2, num_warps=2)
    bound = Bound(kernel, (None, None, 0, 1, 2.0, 0), options, ("X", "Y", "n"))
    x, y = torch.zeros(512), torch.zeros(512)
    seen = []
    real_run = JITFunction.run

    def run(self, *args, **kwargs):
        seen.append(args[2])
        return real_run(self, *args, **kwargs)

    JITFunction.run = run
    try:
        for n in (100, 100, 112, 112, 100):
            bound((triton.cdiv(n, 64),), {"X": x, "Y": y, "n": n})
    finally:
        JITFunction.run = real_run
    assert seen == [100, 112]  # each specialization's first call only
    assert len(stand_in.calls) == 5
    # SHIFT (a constexpr given by name) and BLOCK reach the launcher in their parameters' places
    assert all(call[9 + 6] == 64 and call[9 + 7] == 2 for call in stand_in.calls)


def test_a_launch_hook_leaves_every_call_to_the_jit(stand_in):
    from triton import knobs

    kernel = stand_in.jit(_scaled_copy)
    bound = Bound(kernel, (None, None, 0, 1, 1.0, 0), dict(BLOCK=64), ("X", "Y", "n"))
    x = torch.zeros(256)
    bound((2,), {"X": x, "Y": x, "n": 100})
    hooked = []
    enter = knobs.runtime.launch_enter_hook
    enter.add(hooked.append)
    try:
        bound((2,), {"X": x, "Y": x, "n": 100})
    finally:
        enter.remove(hooked.append)
    # the JIT's launch, with its metadata and the hook (the stand-in launcher calls no hook itself)
    assert len(stand_in.calls) == 2 and stand_in.calls[1][6] is not None and stand_in.calls[1][7] is enter


def test_bench_launch_times_both_ways():
    # the benchmark in its own process, outside the interpreter (the attention kernels compiled for sm_90)
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = outside_interpreter(str(root / "benchmarks" / "bench_launch.py"), "--calls", "3", "--rounds", "1")
    rows = [line.split() for line in out.splitlines() if line.startswith(("attention", "add_layer_norm", "bias_gelu"))]
    assert len(rows) == 4, out
    for row in rows:
        assert float(row[-3]) > 0 and float(row[-2]) > 0 and row[-1].endswith("x"), out
    # and both routes of BERT's and ModernBERT's layers, packed and with a key mask (the benchmark checks that
    # the C++ launches took them; a layer's us, a difference of two stacks' times, is not checked at 3 calls)
    layers = [line.split() for line in out.splitlines() if line.startswith(("BERT layer", "ModernBERT layer"))]
    assert len(layers) == 4, out
    for row in layers:
        # the label's launch count, then six figures, none run into another
        assert row[-7].startswith("(") and row[-4].endswith("x"), out
        for figure in row[-6:-4] + row[-3:]:
            float(figure)


_BOUND_INFERENCE_SCRIPT = r"""
import sys
import torch
from triton.runtime.jit import JITFunction
from fastbert.bench.launch import stand_in_driver
from fastbert.kernels import bias_gelu, geglu, layer_norm

def same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.stride() == b.stride())
    return a is b or (type(a) is type(b) and a == b)

def last_launch(fake, fn):
    before = len(fake.calls)
    fn()
    fn()  # the second call of a specialization: launched directly
    assert len(fake.calls) == before + 2, "one launch a call"
    return fake.calls[-1]

kernels = [v for m in (layer_norm, bias_gelu, geglu) for v in vars(m).values() if isinstance(v, JITFunction)]
torch.manual_seed(0)
with stand_in_driver(kernels=kernels) as fake:
    for dtype in (torch.float16, torch.float32):
        for rows in (48, 37):
            x, r, s = (torch.randn(rows, 64, dtype=dtype) for _ in range(3))
            w, b = torch.randn(64), torch.randn(64)
            i = torch.randn(rows, 128, dtype=dtype)
            ib = torch.randn(128, dtype=dtype)
            cases = [
                (lambda: layer_norm.add_layer_norm_forward(x, r, w, b, 1e-5, 0.0, None, out=x, stats=False),
                 lambda: layer_norm.add_layer_norm_inference(x, r, w, b, 1e-5)),
                (lambda: layer_norm.add_layer_norm_forward(x, r, w, None, 1e-6, 0.0, None, True, rms=True, out=x,
                                                           sum_out=s, stats=False),
                 lambda: layer_norm.add_layer_norm_inference(x, r, w, None, 1e-6, rms=True, return_sum=True, sum_out=s)),
                (lambda: bias_gelu.bias_gelu_forward(i, ib, "tanh", out=i),
                 lambda: bias_gelu.bias_gelu_inference(i, ib, "tanh")),
                (lambda: geglu.geglu_forward(i, "silu"), lambda: geglu.geglu_inference(i, "silu")),
            ]
            for n, (plain, bound) in enumerate(cases):
                want, got = last_launch(fake, plain), last_launch(fake, bound)
                assert got[6] is None, (n, "not launched directly")
                assert len(want) == len(got), n
                for k, (a, c) in enumerate(zip(want, got)):
                    if k not in (6, 7, 8):
                        assert same(a, c), (str(dtype), rows, n, k, a, c)
                # the same tensors where both were given them (geglu's output is fresh each call)
                held = [k for k, a in enumerate(want) if isinstance(a, torch.Tensor) and n != 3]
                assert all(want[k] is got[k] for k in held), (n, "another tensor")
print("ok")
"""


def test_bound_inference_launches_hand_the_launcher_what_the_launchers_do():
    # the kernel modules' *_inference (a model's inference layers' norms and activations, their
    # launches bound once per N and flags) against the launchers' own calls, argument by argument,
    # with the kernels compiled for sm_90 (in its own process: the interpreter compiles nothing)
    out = outside_interpreter("-c", _BOUND_INFERENCE_SCRIPT)
    assert out.strip().endswith("ok"), out


_DRIVER_LEVEL_SCRIPT = r"""
import torch
import triton
import triton.language as tl

from fastbert.bench.launch import stand_in_driver
from fastbert.kernels import Bound, launch


def _scaled_copy(X, Y, n, stride_x, scale, offset: tl.int32, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i * stride_x, mask=i < n)
    tl.store(Y + i, x * scale + offset, mask=i < n)


with stand_in_driver(real_launcher=True) as fake:
    kernel = fake.jit(_scaled_copy)
    x, y = torch.zeros(4096), torch.zeros(4096)
    options = dict(BLOCK=128, num_warps=4)
    # what reaches the driver: the grid, 32 threads a warp, the stream, the function the JIT loaded,
    # then each parameter the kernel was compiled with (pointers as addresses, ints, fp32), the two
    # scratch pointers last; an int of 1 is a constant of its compiled kernel, not a parameter
    kernel[(8,)](x, y, 1000, 3, 0.5, -7, **options)
    got = fake.last_launch()
    assert got.grid == (8, 1, 1) and got.block == (128, 1, 1) and got.stream == 77, got
    assert got.function == fake.calls[-1][4], got
    assert got.params == (x.data_ptr(), y.data_ptr(), 1000, 3, 0.5, -7, 0, 0), got.params
    kernel[(8,)](x, y, 1000, 1, 0.25, 2, **options)
    assert fake.last_launch().params == (x.data_ptr(), y.data_ptr(), 1000, 0.25, 2, 0, 0), fake.last_launch()


    def one_launch(call):
        before = fake.launch_count()
        call()
        assert fake.launch_count() == before + 1
        return fake.last_launch()


    # direct launches (a Bound's, kernels.launch's; past the launcher's Python, to its C) hand the
    # driver what the JIT does, byte for byte
    bound = Bound(kernel, (None, None, 0, 1, 0.5, 3), options, ("X", "Y", "n", "stride_x"))
    for xs, n, stride in ((x, 1000, 1), (x[4:], 1000, 1), (x, 1024, 2), (x, 2**33, 1), (x, 1000, 1)):
        grid = (triton.cdiv(min(n, 4096), 128),)
        want = one_launch(lambda: kernel.run(xs, y, n, stride, 0.5, 3, grid=grid, warmup=False, **options))
        for _ in range(2):  # the first may be the JIT's (kept), the second is direct
            calls = len(fake.calls)
            got = one_launch(lambda: bound(grid, {"X": xs, "Y": y, "n": n, "stride_x": stride}))
            assert got == want, (n, stride, got, want)
            got = one_launch(lambda: launch(kernel, grid, (xs, y, n, stride, 0.5, 3), options))
            assert got == want, (n, stride, got, want)
        assert len(fake.calls) == calls, "the second calls went through the launcher's Python"
print("ok")
"""


def test_direct_launches_reach_the_driver_as_the_jits_do(tmp_path):
    # down to the driver: Triton's own launcher (its Python and its C) over a stand-in libcuda that
    # records the launch configuration and the packed parameters (in a process of its own: it loads
    # that libcuda)
    script_ends_ok(tmp_path, "driver_level.py", _DRIVER_LEVEL_SCRIPT)
