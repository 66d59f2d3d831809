"""fastbert.ops.linear and its GEMM paths (fastbert.ops.gemm): every path against the fp64 product
in every role, the linear op forward and every gradient against F.linear, the measured choice,
and the fallback when a path is missing or broken."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert.ops import gemm, gemm_timing
from tests.helpers.bounds import assert_within_bound, run_with_grads

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def _fresh_choices():
    gemm.reset()
    yield
    gemm.reset()


def _operands(role, tokens, n_in, n_out, dtype, g):
    """(a, b, bias) of a product in `role`, laid out as the linear layer passes them."""
    x = torch.randn(tokens, n_in, generator=g).to(dtype)
    w = torch.randn(n_out, n_in, generator=g).to(dtype)
    dy = torch.randn(tokens, n_out, generator=g).to(dtype)
    bias = torch.randn(n_out, generator=g).to(dtype)
    return {"fwd": (x, w, bias), "dx": (dy, w.t(), None), "dw": (dy.t(), x.t(), None)}[role]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("role", gemm.ROLES)
def test_every_path_gives_the_product(role, dtype):
    g = torch.Generator().manual_seed(1)
    a, b, bias = _operands(role, 67, 48, 80, dtype, g)
    want64 = a.double() @ b.double().t() + (0 if bias is None else bias.double())
    torch_out = (a @ b.t() + (0 if bias is None else bias)).to(dtype)
    paths = gemm.candidates(role, dtype)
    assert "addmm" in paths
    for path in paths:
        with gemm.forced(path):
            got = gemm.product(role, a, b, bias)
        assert_within_bound(f"{path} {role} {dtype}", got, torch_out, want64, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", [None, *gemm.PATHS])
def test_linear_forward_and_gradients(path, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 29, 64, generator=g).to(dtype)
    w, b = torch.randn(96, 64, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    dy = torch.randn(3, 29, 96, generator=g).to(dtype)
    with gemm.forced(path):
        out, grads = run_with_grads(fastbert.ops.linear, [x, w, b], dy)
        with torch.no_grad():
            infer = fastbert.ops.linear(x, w, b)
    base, base_grads = run_with_grads(F.linear, [x, w, b], dy)
    r64, r64_grads = run_with_grads(F.linear, [x.double(), w.double(), b.double()], dy.double())
    for name, got, t, r in zip(["y", "dx", "dw", "db"], [out, *grads], [base, *base_grads], [r64, *r64_grads]):
        assert_within_bound(f"{path} {name}", got, t, r, dtype)
    assert_within_bound(f"{path} inference", infer, base, r64, dtype)


def test_autocast_casts_as_f_linear_does():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(40, 32, generator=g), torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fastbert.ops.linear(*leaves)
        want = F.linear(x, w, b)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    got.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in leaves)


def test_paths_in_contention_are_timed_more_rounds(monkeypatch):
    """TIMED_RUNS rounds for every path; then only the paths within CONTENDING of the fastest, up
    to MAX_ROUNDS, while two or more are; each path's fastest call is kept."""
    clock = [0.0]
    monkeypatch.setattr(gemm_timing.time, "perf_counter", lambda: clock[0])
    # seconds a call: "near" is 10% slower than "fast" at first and as fast from its fifth call on
    # (a library warming up to a shape), "slow" 30% slower throughout
    calls = {"fast": 0, "near": 0, "slow": 0}

    def run(path):
        calls[path] += 1
        clock[0] += {"fast": 1.0, "near": 1.1 if calls["near"] < 5 else 0.99, "slow": 1.3}[path]

    best = gemm_timing.time_paths(list(calls), run)
    assert calls == {"fast": gemm_timing.MAX_ROUNDS + 1, "near": gemm_timing.MAX_ROUNDS + 1, "slow": gemm_timing.TIMED_RUNS + 1}
    assert best == pytest.approx({"fast": 1.0, "near": 0.99, "slow": 1.3})
    assert min(best, key=best.get) == "near"  # the fastest of three calls each would have said "fast"

    calls.update(fast=0, near=0, slow=0)
    gemm_timing.time_paths(["fast", "slow"], run)  # one path left in contention: no more rounds
    assert calls["fast"] == calls["slow"] == gemm_timing.TIMED_RUNS + 1


def test_the_chosen_path_is_the_fastest_timed():
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(300, 64, generator=g), torch.randn(128, 64, generator=g)
    with torch.no_grad():
        fastbert.ops.linear(x, w)
    (key, (chosen, timings)), = gemm.choices().items()
    assert key[:4] == ("fwd", 512, 64, 128)
    assert set(timings) == set(gemm.candidates("fwd", torch.float32))
    assert chosen == min(timings, key=timings.get)


@pytest.mark.parametrize("role", gemm.ROLES)
def test_a_large_product_is_timed_on_its_first_tokens(role, monkeypatch):
    """Products over TIMING_TOKENS tokens: every path timed on the first TIMING_TOKENS only (the
    operands each path sees while timing), then the whole product on the chosen path."""
    monkeypatch.setattr(gemm, "TIMING_TOKENS", 64)
    g = torch.Generator().manual_seed(5)
    a, b, bias = _operands(role, 200, 48, 80, torch.float32, g)
    gemm.candidates(role, torch.float32)  # the paths' probes, on small products of their own, first
    seen, call = [], gemm.call
    monkeypatch.setattr(gemm, "call", lambda p, r, a_, b_, *rest: seen.append((a_.shape, b_.shape)) or call(p, r, a_, b_, *rest))
    got = gemm.product(role, a, b, bias)
    want64 = a.double() @ b.double().t() + (0 if bias is None else bias.double())
    assert_within_bound(role, got, (a @ b.t() + (0 if bias is None else bias)), want64, torch.float32)
    (key, (chosen, timings)), = gemm.choices().items()
    assert key[1] == 256 and chosen == min(timings, key=timings.get)
    timed = {"fwd": (64, 48), "dx": (64, 80), "dw": (80, 64)}[role]
    assert all(shape[0] == torch.Size(timed) for shape in seen[:-1])
    assert (gemm_timing.TIMED_RUNS + 1) * len(timings) + 1 <= len(seen) <= (gemm_timing.MAX_ROUNDS + 1) * len(timings) + 1
    assert seen[-1] == (a.shape, b.shape)


def test_a_broken_path_is_dropped_with_a_warning(monkeypatch):
    def broken(*args):
        raise RuntimeError("no such kernel")

    monkeypatch.setitem(gemm.RUN, "onednn", broken)
    monkeypatch.setattr(gemm.gemm_paths, "offered", lambda path, role, dtype: True)
    with pytest.warns(UserWarning, match="'onednn'.*RuntimeError: no such kernel"):
        paths = gemm.candidates("fwd", torch.float32)
    assert "onednn" not in paths
    x, w = torch.randn(20, 16), torch.randn(24, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not at every product
        with torch.no_grad():
            assert torch.allclose(fastbert.ops.linear(x, w), x @ w.t(), atol=1e-5)
        with gemm.forced("onednn"), torch.no_grad():  # forced onto a dropped path: torch.addmm
            assert torch.allclose(fastbert.ops.linear(x, w), x @ w.t(), atol=1e-5)


def test_a_path_failing_in_fp16_is_dropped_quietly(monkeypatch):
    def broken(*args):
        raise RuntimeError("fp16 path needs avx512_fp16")

    monkeypatch.setitem(gemm.RUN, "onednn", broken)
    monkeypatch.setattr(gemm.gemm_paths, "offered", lambda path, role, dtype: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "onednn" not in gemm.candidates("fwd", torch.float16)
    assert "avx512_fp16" in gemm.unavailable()[("onednn", "fwd", torch.float16)]


def test_a_path_this_build_lacks_is_not_offered(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert gemm.candidates("fwd", torch.float32)[:1] == ["addmm"]
    assert not any(p.startswith("onednn") for p in gemm.candidates("dx", torch.float32))


def test_weights_written_in_place_are_seen():
    """No packed copy is kept: a write through .data (which moves no version counter) shows."""
    x, w = torch.randn(33, 16), torch.randn(24, 16)
    for path in gemm.PATHS:
        with gemm.forced(path), torch.no_grad():
            before = fastbert.ops.linear(x, w)
            w.data.mul_(2)
            assert torch.allclose(fastbert.ops.linear(x, w), 2 * before, atol=1e-4), path
            w.data.div_(2)


def test_unknown_path_is_a_one_line_error(monkeypatch):
    with pytest.raises(ValueError, match="not a GEMM path"):
        with gemm.forced("blas9"):
            pass
    monkeypatch.setenv("FASTBERT_GEMM", "blas9")
    with pytest.raises(ValueError, match="FASTBERT_GEMM='blas9'"), torch.no_grad():
        fastbert.ops.linear(torch.randn(3, 4), torch.randn(5, 4))


@pytest.mark.parametrize("dtype, winner, message", [
    (torch.bfloat16, "fp32", "bfloat16 matrix product"),
    (torch.int8, "float", "no int8 GEMM on this CPU"),
])
def test_fp32_winning_the_measured_choice_is_said_once(monkeypatch, dtype, winner, message):
    """On a CPU without native bf16 (or whose int8 GEMMs all lose), the product runs in fp32, and
    fastbert says so once per dtype, naming the shape and the times."""
    def timings(paths, run):
        for p in paths:
            run(p)
        return {p: 0.001 if p == winner else 0.002 for p in paths}

    monkeypatch.setattr(gemm_timing, "time_paths", timings)
    g = torch.Generator().manual_seed(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tokens in (40, 300):  # two shapes, one warning
            if dtype == torch.int8:
                a = torch.randint(-128, 128, (tokens, 64), generator=g, dtype=torch.int8)
                w = torch.randint(-128, 128, (48, 64), generator=g, dtype=torch.int8)
                assert torch.equal(fastbert.ops.int8_matmul(a, w).double(), (a.long() @ w.long().t()).double())
            else:
                x, w = torch.randn(tokens, 64, generator=g).to(dtype), torch.randn(48, 64, generator=g).to(dtype)
                with torch.no_grad():
                    got = fastbert.ops.linear(x, w)
                want = x.double() @ w.double().t()
                assert got.dtype == dtype
                assert_within_bound("fp32 path", got, (x @ w.t()), want, dtype)
    said = [str(w.message) for w in caught if message in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "[64 x 48]" in said[0] and winner in said[0]
    if dtype == torch.bfloat16:  # a CPU with native bf16 is not told it lacks it
        native = bool(fastbert.backend.native_bf16())
        assert ("has native bf16" in said[0]) == native and ("has no fast" in said[0]) == (not native)
    assert all(choice[0] == winner for key, choice in gemm.choices().items() if key[4] == dtype)


@pytest.mark.parametrize("level", fastbert.backend.cpu_capabilities() or [None])
def test_the_dot_gemm_gives_the_product_at_every_level(level):
    """fastbert's fp32 dot-product GEMM (the "dot" path) at each instruction-set level: shapes whose
    rows, columns and inner size end in partial tiles and vectors, strided rows of a, with and
    without a bias, into an output given, and shapes with nothing to compute."""
    dot = fastbert.backend.cpp_function("f32_dot_gemm")
    if level is None or dot is None:
        pytest.skip("the C++ extension is not built")
    g = torch.Generator().manual_seed(11)
    shapes = [(1, 1, 1), (1, 768, 2304), (20, 768, 3072), (20, 3072, 768), (2, 3, 5), (17, 33, 65), (64, 64, 64),
              (129, 384, 96), (7, 1000, 13)]
    shapes += [tuple(int(v) for v in torch.randint(1, 90, (3,), generator=g)) for _ in range(12)]
    with fastbert.backend.cpu_capability_scope(level):
        for m, k, n in shapes:
            a = torch.randn(m, k + 5, generator=g)[:, 2:2 + k]  # rows strided
            w, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
            for bb in (bias, None):
                want64 = a.double() @ w.double().t() + (0 if bb is None else bb.double())
                torch_out = a @ w.t() + (0 if bb is None else bb)
                assert_within_bound(f"dot {level} {m}x{k}x{n}", dot(a, w, bb), torch_out, want64, torch.float32)
        out = torch.empty(3, 5)
        assert dot(a[:3, :4], w[:5, :4], None, out).data_ptr() == out.data_ptr()
        assert torch.allclose(out, a[:3, :4] @ w[:5, :4].t(), atol=1e-5)
        assert dot(torch.randn(0, 8), torch.randn(4, 8)).shape == (0, 4)
        assert torch.equal(dot(torch.randn(3, 0), torch.randn(4, 0), torch.ones(4)), torch.ones(3, 4))
        with pytest.raises(RuntimeError, match="differ in k"):
            dot(torch.randn(3, 8), torch.randn(4, 9))
        with pytest.raises(RuntimeError, match="contiguous rows"):
            dot(torch.randn(8, 3).t(), torch.randn(4, 8))
