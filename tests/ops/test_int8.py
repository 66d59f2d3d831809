"""The int8 inference ops (fastbert.ops.int8) on every backend against the reference rules
(fastbert.reference.int8) and float64, the int8 GEMM paths against the exact integer product, and
their input errors."""
import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert import layouts
from fastbert.ops import gemm
from fastbert.reference import int8 as ref
from tests.helpers.backends import require

BACKENDS = ["torch", "cpp"]
SHAPES = [(1, 1), (5, 7), (33, 16), (64, 384), (3, 1023)]
FP32_EPS = 1.2e-7


@pytest.fixture(params=BACKENDS)
def backend(request):
    require(request.param)
    return request.param


def _quantized_close(got, want, name):
    """Quantized rows from two computations of the same float rows: scales and offsets equal to
    fp32 rounding, q within one step (a value that lands near x.5 may round either way)."""
    (q, s, o), (wq, ws, wo) = got, want
    assert q.dtype == torch.int8 and q.shape == wq.shape, f"{name}: q {q.dtype} {tuple(q.shape)}"
    assert torch.equal(q[-1], torch.ones_like(q[-1])), f"{name}: the last row of q must be ones"
    torch.testing.assert_close(s, ws, rtol=1e-5, atol=1e-7, msg=f"{name}: scales")
    torch.testing.assert_close(o, wo, rtol=1e-5, atol=1e-6, msg=f"{name}: offsets")
    diff = (q.int() - wq.int()).abs()
    assert int(diff.max()) <= 1, f"{name}: q differs by {int(diff.max())}"
    assert float((diff > 0).float().mean()) < 0.01, f"{name}: {float((diff > 0).float().mean()):.3%} of q differ"


def _dequantized(q, s, o):
    return q[:-1].double() * s.double()[:, None] + o.double()[:, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, n", SHAPES)
def test_quantize_rows_follows_the_rule(backend, rows, n, dtype):
    g = torch.Generator().manual_seed(rows * 131 + n)
    x = (torch.randn(rows, n, generator=g) * 3 + torch.randn(rows, 1, generator=g)).to(dtype)
    got = fastbert.ops.quantize_rows(x, backend=backend)
    if backend == "cpp" or dtype == torch.float32:  # the same fp32 operations: the same bits
        for a, b in zip(got, ref.quantize_rows(x)):
            assert torch.equal(a, b)
    q, s, o = got
    x64 = x.double()
    # the reconstruction is within half a step of x, and the extremes map to -127 and 127
    assert ((_dequantized(q, s, o) - x64).abs() <= s.double()[:, None] * (0.5 + 1e-4) + 1e-6).all()
    if n > 1:
        nonconstant = s > 0
        assert (q[:-1][nonconstant].abs().amax(1) == 127).all()


def test_quantize_rows_constant_and_zero_rows(backend):
    x = torch.stack([torch.zeros(40), torch.full((40,), -2.5), torch.linspace(-1, 3, 40)])
    q, s, o = fastbert.ops.quantize_rows(x, backend=backend)
    assert s[0] == 0 and o[0] == 0 and (q[0] == 0).all()
    assert s[1] == 0 and o[1] == -2.5 and (q[1] == 0).all()
    assert torch.allclose(_dequantized(q, s, o)[2], x[2].double(), atol=float(s[2]) / 2 + 1e-7)


@pytest.mark.parametrize("qmax", [127, 64])
def test_quantize_weight_is_per_channel_symmetric(qmax):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 80, generator=g) * torch.rand(48, 1, generator=g)
    q, s = fastbert.ops.quantize_weight(w, qmax)
    assert q.dtype == torch.int8 and s.shape == (48,)
    assert (q.abs().amax(1) == qmax).all() and int(q.min()) >= -qmax
    assert ((q.double() * s.double()[:, None] - w.double()).abs() <= s.double()[:, None] / 2 + 1e-7).all()
    with pytest.raises(ValueError, match="qmax must be one of"):
        fastbert.ops.quantize_weight(w, 100)


@pytest.mark.parametrize("m, k, n", [(1, 768, 64), (7, 100, 48), (130, 384, 96)])
def test_the_packed_gemm_is_exact_on_full_range_weights(m, k, n):
    """Weights in [-127, 127] (the default range on every CPU) and every activation value, on weights
    stored packed: the exact product at every level (avx2 multiplies |a| by the weight with a's sign in
    16-bit pairs, which [-127, 127] never overflows); a weight holding -128, which that negation wraps,
    still exact (the kernel checks and runs its plain loop)."""
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    a[0, :] = -128  # the largest |a| against the largest weights, pair by pair
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    w[:2, :] = 127
    w[2, :] = -127
    want = a.long() @ w.long().t()
    got = fastbert.ops.int8_matmul(a, fastbert.ops.pack_int8_weight(w))
    assert torch.equal(got.long(), want)
    w[5, 1::2] = -128
    got = fastbert.ops.int8_matmul(a, fastbert.ops.pack_int8_weight(w))
    assert torch.equal(got.long(), a.long() @ w.long().t())


@pytest.fixture
def _fresh_choices():
    gemm.reset()
    yield
    gemm.reset()


@pytest.mark.parametrize("m, k, n", [(1, 8, 8), (37, 24, 40), (129, 384, 96)])
def test_every_int8_gemm_path_is_exact(_fresh_choices, m, k, n):
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    want = a.long() @ w.long().t()
    paths = gemm.candidates("fwd", torch.int8)
    # fastbert's kernel is a candidate wherever the extension is built, and the float product
    # everywhere, unless it is SLOW_INT8 times slower than the fastest path here (fastbert's scalar
    # level against a library's VNNI kernel; the float product against fastbert's avx2 kernel)
    def slow(path):
        return "slower than" in gemm.unavailable().get((path, "fwd", torch.int8), "")

    assert "float" in paths or slow("float")
    assert ("fastbert" in paths or slow("fastbert")) == fastbert.backend.cpp_available()
    for path in paths:
        with gemm.forced(path):
            got = fastbert.ops.int8_matmul(a, w)
        assert got.shape == (m, n) and torch.equal(got.double(), want.double()), path
    got = fastbert.ops.int8_matmul(a, w)  # the measured choice
    assert torch.equal(got.double(), want.double())
    assert any(key[0] == "fwd" and key[4] == torch.int8 for key in gemm.choices())


def test_int8_paths_far_slower_than_the_fastest_are_not_timed(_fresh_choices, monkeypatch):
    """An int8 path SLOW_INT8 times slower than the fastest (torch._int_mm's scalar loop on CPUs without
    VNNI) is left out of the measured choice, and unavailable() says why."""
    everything = gemm.candidates("fwd", torch.int8)
    gemm.reset()
    monkeypatch.setattr(gemm, "SLOW_INT8", 1.0)  # anything slower than the fastest
    kept = gemm.candidates("fwd", torch.int8)
    assert len(kept) == 1 and kept[0] in everything
    why = gemm.unavailable()
    for path in set(everything) - set(kept):
        assert "slower than " + kept[0] in why[(path, "fwd", torch.int8)]


def _levels():
    return fastbert.backend.cpu_capabilities() or [None]


def _gemm_operands(m, k, n, g):
    """(a [m, k], b [n, k]) int8 pairs for an int8 GEMM: a with strided rows and random weights, the
    values that saturate a 16-bit product (AVX2's u8 x s8 pairs) where the exact sum does not,
    weights in [-64, 64] at their extremes, and such weights with one value just out of the range."""
    a = torch.randint(-128, 128, (m, k + 5), generator=g, dtype=torch.int8)[:, 2:2 + k]  # rows strided
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    w64 = torch.randint(-64, 65, (n, k), generator=g, dtype=torch.int8)  # weights in [-64, 64]
    late, edge = w64.clone(), torch.full_like(w, 64)
    late[-1, -1] = -128  # one value out of [-64, 64], in the last panel: that task runs again
    edge[-1, -1] = 65  # just out of it: beside a 64 (even k), 255 x 65 + 255 x 64 overflows 16 bits
    lo, hi = torch.full_like(a, -128), torch.full_like(a, 127)
    mixed = (torch.randint(0, 2, w.shape, generator=g) * 255 - 128).to(torch.int8)
    return [(a, w), (lo, torch.full_like(w, -128)), (hi, torch.full_like(w, -128)), (lo, mixed), (a, w64),
            (hi, torch.full_like(w, 64)), (hi, torch.full_like(w, -64)), (lo, w64), (a, late), (hi, edge)]


def _exact_at(level, kernel, shapes, g, prepare, out_cols):
    """The extension's int8 GEMM `kernel` at `level`, its weight through prepare(), exact on every
    shape and operand pair of _gemm_operands, and written into `out` when given one."""
    require("cpp")  # skips where the extension is not built, fails there in CI
    gemm_fn = fastbert.backend.cpp_function(kernel)
    with fastbert.backend.cpu_capability_scope(level):
        for m, k, n in shapes:
            for x, y in _gemm_operands(m, k, n, g):
                got = gemm_fn(x, prepare(y))  # exact in float64: |sums| < 2^53
                assert torch.equal(got.double(), x.double() @ y.double().t()), (level, m, k, n)
        a, w = _gemm_operands(3, 4, out_cols, g)[0]
        out = torch.empty(3, out_cols, dtype=torch.int32)
        assert gemm_fn(a, prepare(w), out).data_ptr() == out.data_ptr()
        assert torch.equal(out.long(), a.long() @ w.long().t())


@pytest.mark.parametrize("level", _levels())
def test_fastbert_int8_gemm_is_exact_at_every_level(level):
    """fastbert's own int8 GEMM at each instruction-set level: odd shapes, k with and without a tail
    past the vector steps, k over one k-block, rows with a stride, and the values that saturate a
    16-bit product (AVX2's u8 x s8 pairs) where the exact sum does not."""
    g = torch.Generator().manual_seed(7)
    shapes = [(1, 1, 1), (1, 768, 2304), (2, 3, 5), (17, 33, 65), (64, 64, 64), (129, 384, 96), (300, 768, 77),
              (21, 3072, 9), (400, 1024, 6), (5, 100, 13)]
    shapes += [tuple(int(v) for v in torch.randint(1, 90, (3,), generator=g)) for _ in range(12)]
    _exact_at(level, "int8_gemm", shapes, g, lambda w: w, 5)


@pytest.mark.parametrize("level", _levels())
def test_packed_int8_gemm_is_exact_at_every_level(level):
    """fastbert's int8 GEMM on a packed weight (a layer's only copy where int8_layout says packed) at
    each level: rows by the tile and not, 1 to 3 panels a column group and past it, k with a partial
    last k-group, rows with a stride, the extreme values, weights in [-64, 64] (AVX2's u8 x s8
    scheme) and one value out of that range."""
    g = torch.Generator().manual_seed(11)
    shapes = [(1, 1, 16), (1, 768, 2304), (2, 3, 32), (8, 64, 48), (9, 33, 64), (21, 3072, 768), (21, 768, 3072),
              (130, 130, 80), (300, 1023, 16), (17, 5, 1024)]
    shapes += [(int(m), int(k), 16 * int(p)) for m, k, p in torch.randint(1, 70, (10, 3), generator=g)]
    _exact_at(level, "int8_gemm_packed", shapes, g, fastbert.ops.pack_int8_weight, 32)


@pytest.mark.parametrize("level", _levels())
def test_packed_int8_gemm_is_exact_whatever_the_threads_and_their_claims(level):
    """With enough rows the packed GEMM's tasks (row ranges x column ranges) outnumber the threads and
    are claimed in turn: exact at 1, 2 and 3 threads, on one panel, on column groups fewer and more
    than the threads, and where one task's weight is out of the AVX2 scheme's range."""
    require("cpp")
    gemm_fn = fastbert.backend.cpp_function("int8_gemm_packed")
    g = torch.Generator().manual_seed(13)
    shapes = [(300, 97, 16), (257, 64, 80), (531, 130, 208), (64, 33, 1536)]
    before = torch.get_num_threads()
    try:
        with fastbert.backend.cpu_capability_scope(level):
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                for m, k, n in shapes:
                    for x, y in _gemm_operands(m, k, n, g)[::4]:  # random; in [-64, 64]; one value out of it
                        got = gemm_fn(x, fastbert.ops.pack_int8_weight(y))
                        assert torch.equal(got.double(), x.double() @ y.double().t()), (level, threads, m, k, n)
    finally:
        torch.set_num_threads(before)


def test_packed_int8_gemm_on_amx_tiles_is_exact():
    """At the level amx (a CPU with AMX-INT8 whose OS grants its tiles), the packed GEMM runs whole
    blocks of 16 rows on them and the rest on the vector kernels: exact against the int64 product and
    equal to the vector kernels alone (the level avx512_vnni), with the tiles' every edge: 16 to 33
    rows and a large row count, one panel and an odd number of panels, k of one tile and of many,
    strided rows, every int8 value (tdpbssd multiplies s8 x s8), at 1, 2 and 3 threads; k not a
    multiple of 64 stays on the vector kernels."""
    require("cpp")
    if "amx" not in fastbert.backend.cpu_capabilities():
        pytest.skip("no AMX int8 tiles here (the CPU, its OS, or a build without the avx512_vnni library): the "
                    "vector kernels, tested above, are the only path")
    ext = fastbert.backend.cpp_extension()
    gemm_fn = fastbert.backend.cpp_function("int8_gemm_packed")
    g = torch.Generator().manual_seed(17)
    shapes = [(16, 64, 16), (17, 64, 48), (31, 128, 32), (32, 768, 80), (33, 3072, 16), (300, 768, 2304),
              (48, 130, 32), (530, 256, 208)]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for m, k, n in shapes:
                a = torch.randint(-128, 128, (m, k + 5), generator=g, dtype=torch.int8)[:, 2:2 + k]
                w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
                a[0], w[0] = -128, -128
                packed = fastbert.ops.pack_int8_weight(w)
                want = a.long() @ w.long().t()
                with fastbert.backend.cpu_capability_scope("amx"):
                    assert ext.int8_amx()
                    on = gemm_fn(a, packed)
                with fastbert.backend.cpu_capability_scope("avx512_vnni"):
                    assert not ext.int8_amx()
                    off = gemm_fn(a, packed)
                assert torch.equal(on.long(), want), (threads, m, k, n)
                assert torch.equal(off, on), (threads, m, k, n)
    finally:
        torch.set_num_threads(before)


def test_amx_runs_only_at_its_level():
    """The tiles run at the level amx only: it is offered where the CPU has AMX-INT8 and the library
    below it, and the levels below it (a capped level stands for a CPU without AMX) keep them off;
    use_kernels refuses the level without a library anywhere but over avx512_vnni, and where the CPU
    cannot run it, with one line each."""
    require("cpp")
    ext = fastbert.backend.cpp_extension()
    levels = fastbert.backend.cpu_capabilities()
    assert ("amx" in levels) == ("amx" in ext.cpu_levels() and "avx512_vnni" in levels)
    if "amx" in ext.cpu_levels():  # the CPU has the tiles and its OS grants them
        assert "amx" in fastbert.backend.cpu_features()
    for level in levels:
        if level != "native":
            with fastbert.backend.cpu_capability_scope(level):
                assert ext.int8_amx() == (level == "amx"), level
    with pytest.raises(RuntimeError, match="only the level amx has no library"):
        ext.use_kernels(["scalar", "amx"], [fastbert.backend.library("scalar"), ""])
    if "amx" not in ext.cpu_levels() and "avx512_vnni" in levels:
        with pytest.raises(RuntimeError, match="does not run the level amx"):
            ext.use_kernels(["avx512", "avx512_vnni", "amx"],
                            [fastbert.backend.library("avx512"), fastbert.backend.library("avx512_vnni"), ""])


@pytest.mark.parametrize("k", [1, 4, 7, 768])
def test_packed_weights_round_trip_and_multiply_as_the_plain_ones(k):
    """pack / unpack are inverses; int8_matmul (the C++ kernel where built) and the reference (other
    devices, backend="torch") multiply by a packed weight exactly."""
    g = torch.Generator().manual_seed(k)
    w = torch.randint(-128, 128, (48, k), generator=g, dtype=torch.int8)
    a = torch.randint(-128, 128, (5, k), generator=g, dtype=torch.int8)
    packed = fastbert.ops.pack_int8_weight(w)
    assert packed.shape == (3, (k + 3) // 4, 16, 4) and torch.equal(fastbert.ops.unpack_int8_weight(packed, k), w)
    for got in (fastbert.ops.int8_matmul(a, packed), ref.int8_mm(a, packed)):
        assert torch.equal(got.long(), a.long() @ w.long().t())


def test_int8_layout_is_measured_or_pinned(monkeypatch, _fresh_choices):
    """packed or plain, measured once per (threads, level) with both timings kept; the variable pins
    it, and a forced GEMM path keeps the plain layout it takes."""
    got = fastbert.ops.int8.int8_layout()
    assert got in fastbert.ops.int8.INT8_LAYOUTS
    if fastbert.backend.cpp_available():
        (chosen, timed), = fastbert.ops.int8.int8_layouts().values()
        assert chosen == got and 32 in timed and all(set(t) == {"packed", "plain"} for t in timed.values())
        assert got == fastbert.ops.int8.layout_of(timed)
    # the geometric mean of the ratios: a large product that ties does not outvote a small one that wins
    assert fastbert.ops.int8.layout_of({32: {"packed": 1.0, "plain": 2.0}, 512: {"packed": 11.0, "plain": 10.0}}) == "packed"
    assert fastbert.ops.int8.layout_of({32: {"packed": 3.0, "plain": 2.0}}) == "plain"
    with gemm.forced("int_mm"):
        assert fastbert.ops.int8.int8_layout() == "plain"
    for pinned in fastbert.ops.int8.INT8_LAYOUTS:
        monkeypatch.setenv("FASTBERT_INT8_LAYOUT", pinned)
        assert fastbert.ops.int8.int8_layout() == pinned
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", "tiled")
    with pytest.raises(ValueError, match="choose packed or plain"):
        fastbert.ops.int8.int8_layout()


def test_stored_weight_packs_where_layers_do(monkeypatch):
    """packed only under the packed layout and for out a multiple of 16; plain, the same tensor, otherwise."""
    g = torch.Generator().manual_seed(3)
    w32, w24 = (torch.randint(-127, 128, (n, 40), generator=g, dtype=torch.int8) for n in (32, 24))
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", "packed")
    assert torch.equal(fastbert.ops.int8.stored_weight(w32), fastbert.ops.pack_int8_weight(w32))
    assert fastbert.ops.int8.stored_weight(w24) is w24
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", "plain")
    assert fastbert.ops.int8.stored_weight(w32) is w32
    # a layout given (the benchmark's floor on packed weights) in place of the measured one
    assert torch.equal(fastbert.ops.int8.stored_weight(w32, "packed"), fastbert.ops.pack_int8_weight(w32))
    assert fastbert.ops.int8.stored_weight(w24, "packed") is w24


def _layer_inputs(rows, k, n, g, acc_dtype=torch.int32):
    """A real int8 layer: activations quantized with their ones row, a weight, the accumulator."""
    x = torch.randn(rows, k, generator=g) + 0.5 * torch.randn(k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05
    xq, xs, xo = ref.quantize_rows(x)
    wq, ws = layouts.quantize_weight(w)
    acc = ref.int8_mm(xq, wq).to(acc_dtype)
    bias = torch.randn(n, generator=g) * 0.1
    return acc, xs, xo, ws, bias


def _dequantized64(acc, xs, xo, ws, bias):
    a = acc.double()
    return (a[:-1] * xs.double()[:, None] + xo.double()[:, None] * a[-1]) * ws.double() + bias.double()


def _epilogue_bound(acc, xs, xo, ws, bias):
    """fp32 rounding of the epilogue's few operations, element by element."""
    a = acc.double()
    terms = (a[:-1] * xs.double()[:, None]).abs() * ws.double() + (xo.double()[:, None] * a[-1] * ws.double()).abs()
    return 8 * FP32_EPS * (terms + bias.double().abs()) + 1e-30


@pytest.mark.parametrize("acc_dtype", [torch.int32, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k, n", [(1, 8, 3), (29, 64, 100), (70, 384, 1152)])
def test_int8_dequantize_against_float64(backend, rows, k, n, dtype, acc_dtype):
    g = torch.Generator().manual_seed(rows + n)
    args = _layer_inputs(rows, k, n, g, acc_dtype)
    y = fastbert.ops.int8_dequantize(*args, dtype=dtype, backend=backend)
    want = _dequantized64(*args)
    assert y.dtype == dtype and y.shape == (rows, n)
    bound = _epilogue_bound(*args) + (0 if dtype == torch.float32 else want.abs() * 2 ** -8)
    assert ((y.double() - want).abs() <= bound).all()
    # and the layer it stands for: x @ w^T + b up to the quantization of x and w
    assert y.shape == want.shape


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("rows, k, n", [(1, 8, 5), (33, 64, 1536), (64, 384, 3072)])
def test_int8_bias_gelu_against_the_rule(backend, rows, k, n, approximate):
    g = torch.Generator().manual_seed(rows + n + len(approximate))
    acc, xs, xo, ws, bias = _layer_inputs(rows, k, n, g)
    got = fastbert.ops.int8_bias_gelu(acc, xs, xo, ws, bias, approximate, backend=backend)
    act64 = F.gelu(_dequantized64(acc, xs, xo, ws, bias), approximate=approximate)
    _quantized_close(got, ref.quantize_rows(act64.float()), "int8_bias_gelu")
    q, s, o = got
    assert ((_dequantized(q, s, o) - act64).abs() <= s.double()[:, None] * 0.5 + 1e-5).all()


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("gate", ["none", "tanh", "silu"])
@pytest.mark.parametrize("rows, k, n", [(1, 8, 5), (7, 32, 17), (33, 64, 768), (16, 96, 1000)])
def test_int8_glu_against_the_rule(backend, rows, k, n, gate, with_bias):
    """A gated unit's [gate, up] products (2n columns; n not a whole number of vectors puts the up half
    off the vector grid) -> act(gate) * up quantized, as quantize_rows of it in float64 would be."""
    g = torch.Generator().manual_seed(rows + n + len(gate))
    acc, xs, xo, ws, bias = _layer_inputs(rows, k, 2 * n, g)
    bias = bias if with_bias else None
    got = fastbert.ops.int8_glu(acc, xs, xo, ws, bias, gate, backend=backend)
    a, u = _dequantized64(acc, xs, xo, ws, torch.zeros(2 * n) if bias is None else bias).chunk(2, dim=-1)
    act64 = (F.silu(a) if gate == "silu" else F.gelu(a, approximate=gate)) * u
    assert got[0].shape == (rows + 1, n)
    _quantized_close(got, ref.quantize_rows(act64.float()), "int8_glu")
    q, s, o = got
    assert ((_dequantized(q, s, o) - act64).abs() <= s.double()[:, None] * 0.5 + 1e-5).all()


def test_int8_glu_refuses_an_odd_accumulator_or_an_unknown_gate(backend):
    acc, xs, xo, ws, bias = _layer_inputs(3, 8, 5, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="an even number"):
        fastbert.ops.int8_glu(acc, xs, xo, ws, bias, backend=backend)
    acc, xs, xo, ws, bias = _layer_inputs(3, 8, 6, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="gate must be one of none, tanh, silu, got 'relu'"):
        fastbert.ops.int8_glu(acc, xs, xo, ws, bias, "relu", backend=backend)


@pytest.mark.parametrize("quantize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k, n", [(1, 8, 4), (45, 64, 384), (17, 3072, 768)])
def test_int8_add_layer_norm_against_float64(backend, rows, k, n, dtype, quantize):
    g = torch.Generator().manual_seed(rows * 7 + n)
    acc, xs, xo, ws, bias = _layer_inputs(rows, k, n, g)
    residual = torch.randn(rows, n, generator=g).to(dtype)
    weight, ln_bias = 1 + 0.1 * torch.randn(n, generator=g), torch.randn(n, generator=g)
    y, q, s, o = fastbert.ops.int8_add_layer_norm(acc, xs, xo, ws, bias, residual, weight, ln_bias, 1e-12,
                                                  quantize=quantize, backend=backend)
    h = _dequantized64(acc, xs, xo, ws, bias) + residual.double()
    want = F.layer_norm(h, (n,), weight.double(), ln_bias.double(), 1e-12)
    assert y.dtype == dtype and y.shape == (rows, n)
    # fp32 statistics: as good as torch's own fp32 LayerNorm on the same sum, within 2x and a floor
    torch_err = (F.layer_norm(h.float(), (n,), weight, ln_bias, 1e-12).double() - want).abs().max()
    floor = 1e-5 if dtype == torch.float32 else 2 ** -8 * float(want.abs().max())
    assert float((y.double() - want).abs().max()) <= 2 * float(torch_err) + floor
    if quantize:
        _quantized_close((q, s, o), ref.quantize_rows(want.float()), "int8_add_layer_norm")
    else:
        assert q.numel() == 0 and s.numel() == 0 and o.numel() == 0


@pytest.mark.parametrize("quantize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("acc_dtype", [torch.int32, torch.float32])
@pytest.mark.parametrize("rows, k, n", [(1, 8, 4), (45, 64, 384), (17, 3072, 768)])
def test_int8_add_layer_norm_returns_the_sum(backend, rows, k, n, acc_dtype, dtype, quantize):
    """return_sum: the residual stream h = dequantized acc + residual as a fifth output in residual's
    dtype (within fp32 rounding of the epilogue, then one rounding to the dtype), from the same pass;
    the other four outputs bit for bit the default's. In fp32 h is exactly what the residual plus
    int8_dequantize gives (the two passes it replaces)."""
    g = torch.Generator().manual_seed(rows * 5 + n)
    args = _layer_inputs(rows, k, n, g, acc_dtype)
    residual = (3 * torch.randn(rows, n, generator=g)).to(dtype)
    weight, ln_bias = 1 + 0.1 * torch.randn(n, generator=g), torch.randn(n, generator=g)
    call = lambda **kw: fastbert.ops.int8_add_layer_norm(*args, residual, weight, ln_bias, 1e-12,  # noqa: E731
                                                         quantize=quantize, backend=backend, **kw)
    default, fused = call(), call(return_sum=True)
    assert len(default) == 4 and len(fused) == 5
    for name, a, b in zip(("y", "q", "scale", "offset"), default, fused[:4]):
        assert torch.equal(a, b), f"{name} differs from the default form's"
    h = fused[4]
    assert h.dtype == dtype and h.shape == (rows, n)
    want = _dequantized64(*args) + residual.double()
    rounding = 0 if dtype == torch.float32 else want.abs() * 2.0 ** -(8 if dtype == torch.bfloat16 else 11)
    assert ((h.double() - want).abs() <= _epilogue_bound(*args) + 2 * FP32_EPS * want.abs() + rounding).all()
    if dtype == torch.float32:
        assert torch.equal(h, residual + fastbert.ops.int8_dequantize(*args, dtype=dtype, backend=backend))


def test_the_cpp_kernels_take_torchs_int8_gemm_outputs_end_to_end():
    """One linear layer, quantized: quantize_rows -> int8_matmul -> int8_dequantize, against F.linear."""
    require("cpp")
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(50, 96, generator=g) + 1.0, torch.randn(40, 96, generator=g) * 0.1, torch.randn(40, generator=g)
    q, s, o = fastbert.ops.quantize_rows(x)
    wq, ws = fastbert.ops.quantize_weight(w)
    y = fastbert.ops.int8_dequantize(fastbert.ops.int8_matmul(q, wq), s, o, ws, b)
    want = F.linear(x.double(), w.double(), b.double())
    # the quantization error of x (half a step per element) and of w (half a step per weight)
    bound = (s.double()[:, None] * 0.5) * w.double().abs().sum(1) + x.double().abs().sum(1)[:, None] * ws.double() * 0.5
    assert ((y.double() - want).abs() <= 1.01 * bound + 1e-4).all()


@pytest.mark.parametrize("chunk", [-1, 0, 16, 48])
@pytest.mark.parametrize("rows, k, n", [(1, 64, 32), (17, 72, 48), (100, 64, 80), (161, 128, 32)])
def test_packed_products_in_chunks_are_the_accumulator_ops(rows, k, n, chunk):
    """int8_packed_* (the product of a packed weight handed to its epilogue a chunk of rows at a time,
    as the C++ int8 layers run it) give the bits of the whole accumulator's op: every chunk length,
    the last chunk short, a single row, k not a multiple of the tiles', at the levels this CPU runs
    (the tiles' and the vector kernels' rows)."""
    require("cpp")
    ext = fastbert.backend.cpp_extension()
    g = torch.Generator().manual_seed(rows * 7 + k + n)
    q, s, o = fastbert.ops.quantize_rows(torch.randn(rows, k, generator=g) + 0.3)
    packed = fastbert.ops.pack_int8_weight(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8))
    cs, b = torch.rand(n, generator=g) * 1e-2, torch.randn(n, generator=g)
    residual, lw, lb = torch.randn(rows, n, generator=g), torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
    previous = ext.set_int8_chunk_rows(chunk)
    try:
        for level in fastbert.backend.cpu_capabilities():
            with fastbert.backend.cpu_capability_scope(level):
                acc = ext.int8_gemm_packed(q, packed)
                assert torch.equal(ext.int8_packed_dequantize(q, packed, s, o, cs, b, torch.float32),
                                   ext.int8_dequantize(acc, s, o, cs, b, torch.float32)), level
                for approximate in ("none", "tanh"):
                    for got, want in zip(ext.int8_packed_bias_gelu(q, packed, s, o, cs, b, approximate),
                                         ext.int8_bias_gelu(acc, s, o, cs, b, approximate)):
                        assert torch.equal(got, want), (level, approximate)
                for quantize in (True, False):
                    got = ext.int8_packed_add_layer_norm(q, packed, s, o, cs, b, residual, lw, lb, 1e-5, quantize,
                                                         True)
                    want = ext.int8_add_layer_norm(acc, s, o, cs, b, residual, lw, lb, 1e-5, quantize, True)
                    for x, y in zip(got, want):
                        assert torch.equal(x, y), (level, quantize)
    finally:
        ext.set_int8_chunk_rows(previous)


def test_the_layers_int8_pieces_on_packed_weights_give_the_plain_weights_bits():
    """fastbert.ops.encoder's int8 pieces (the other families' layers) take a packed weight's chunked
    product (int8_packed_*) and give the bits of the same weight unpacked (int8_matmul, then the op)."""
    require("cpp")
    from fastbert.ops import encoder

    ext = fastbert.backend.cpp_extension()
    g = torch.Generator().manual_seed(5)
    rows, k = 70, 64
    xq = fastbert.ops.quantize_rows(torch.randn(rows, k, generator=g))
    stream, nw, nb = torch.randn(rows, k, generator=g), torch.rand(k, generator=g) + 0.5, torch.randn(k, generator=g)

    def weight(n):
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        return w, fastbert.ops.pack_int8_weight(w), torch.rand(n, generator=g) * 1e-2, torch.randn(n, generator=g)

    (w1, p1, s1, b1), (w2, p2, s2, b2), (w3, p3, s3, b3) = weight(96), weight(96), weight(k)
    previous = ext.set_int8_chunk_rows(16)
    try:
        pairs = [(encoder.int8_linear(xq, p1, s1, b1, torch.float32), encoder.int8_linear(xq, w1, s1, b1, torch.float32))]
        pairs += list(zip(encoder.int8_glu_rows(xq, p2, s2, b2, "silu"), encoder.int8_glu_rows(xq, w2, s2, b2, "silu")))
        for quantize in (True, False):
            for want_sum in (True, False):
                got = encoder.int8_add_norm(xq, p3, s3, b3, stream, nw, nb, 1e-5, quantize, want_sum)
                want = encoder.int8_add_norm(xq, w3, s3, b3, stream, nw, nb, 1e-5, quantize, want_sum)
                assert (got[1] is None) == (want[1] is None) and (got[2] is None) == (want[2] is None)
                pairs += [(got[0], want[0])] + list(zip(got[1] or (), want[1] or ()))
                pairs += [(got[2], want[2])] if want_sum else []
    finally:
        ext.set_int8_chunk_rows(previous)
    for got, want in pairs:
        assert torch.equal(got, want)


def test_packed_products_refuse_bad_input_in_one_line():
    require("cpp")
    ext = fastbert.backend.cpp_extension()
    q, s, o = fastbert.ops.quantize_rows(torch.randn(5, 64))
    packed = fastbert.ops.pack_int8_weight(torch.ones(32, 64, dtype=torch.int8))
    for call, message in [
        (lambda: ext.int8_packed_dequantize(q, packed[:, :8], s, o, torch.ones(32), None, torch.float32),
         "bp must be a contiguous int8 weight packed"),
        (lambda: ext.int8_packed_dequantize(q.float(), packed, s, o, torch.ones(32), None, torch.float32),
         "a must be a 2-D int8"),
        (lambda: ext.int8_packed_bias_gelu(q, packed, s[:3], o, torch.ones(32), torch.zeros(32)),
         "row scales and offsets must be contiguous float32 [5]"),
        (lambda: ext.set_int8_chunk_rows(-2), "rows must be -1 (off), 0"),
    ]:
        with pytest.raises(RuntimeError) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value).strip(), str(e.value)


@pytest.mark.parametrize("call, message", [
    (lambda: fastbert.ops.quantize_rows(torch.zeros(2, 3, 4)), "must be 2-D"),
    (lambda: fastbert.ops.quantize_rows(torch.zeros(2, 3, dtype=torch.int32)), "dtype"),
    (lambda: fastbert.ops.int8_matmul(torch.zeros(2, 3), torch.zeros(4, 3, dtype=torch.int8)), "int8"),
    (lambda: fastbert.ops.int8_matmul(torch.zeros(2, 3, dtype=torch.int8), torch.zeros(4, 5, dtype=torch.int8)),
     "features"),
    (lambda: fastbert.ops.int8_matmul(torch.zeros(2, 9, dtype=torch.int8), torch.zeros(1, 2, 16, 4, dtype=torch.int8)),
     "a has 9 features but weight takes 5 to 8"),
    (lambda: fastbert.ops.pack_int8_weight(torch.zeros(20, 8, dtype=torch.int8)), "out a multiple of 16"),
    (lambda: fastbert.ops.unpack_int8_weight(torch.zeros(1, 2, 16, 4, dtype=torch.int8), 9), "for 9 features"),
    (lambda: fastbert.ops.int8_dequantize(torch.zeros(3, 4, dtype=torch.int32), torch.zeros(3), torch.zeros(2),
                                          torch.zeros(4)), "row_scale must be float32 of shape (2,)"),
    (lambda: fastbert.ops.int8_add_layer_norm(torch.zeros(3, 4, dtype=torch.int32), torch.zeros(2), torch.zeros(2),
                                              torch.zeros(4), torch.zeros(4), torch.zeros(3, 4), torch.ones(4),
                                              torch.zeros(4)), "residual has shape"),
])
def test_bad_input_is_one_readable_error(call, message):
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value)
