"""fastbert.ops.cuda_stack: a model's post-LN inference layers launched from C++ must hand the
driver exactly what the Python route hands it, launch for launch: the same compiled kernels, grids,
threads, shared memory, stream and parameters, byte for byte (a pointer the same tensor's: an
input's, a weight's, the sink's, or the same aten call's output in both routes), with the same aten
calls around them. Checked without a GPU: Triton's JIT compiles the kernels for sm_90 and its own
launcher hands them to a stand-in libcuda that records each launch (fastbert.bench.launch), in a
process of its own (the interpreter compiles nothing, and the stand-in is loaded into the process).
What this cannot check, the kernels run from those launches, run_cuda.sh does on a GPU
(benchmarks/check_modern_cuda.py compares the two routes' outputs there)."""
import pytest

pytest.importorskip("triton")

from tests.helpers.stand_in import script_ends_ok  # noqa: E402

_SCRIPT = r"""
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastbert import kernels
from fastbert.bench.launch import fastbert_jit_kernels, stand_in_driver
from fastbert.kernels import launches_recorded
from fastbert.ops import cuda_stack, encoder

H, HEADS, F = 64, 4, 128


class Made(TorchDispatchMode):
    # each aten call that is not a view: its name, and its output's bytes with the launches made before it
    def __init__(self, fake):
        super().__init__()
        self.fake, self.ops, self.made = fake, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.ops.append(str(func))
            if isinstance(out, torch.Tensor) and out.numel():
                start = out.data_ptr()
                self.made.append((self.fake.launch_count(), start, start + out.numel() * out.element_size()))
        return out


def traced(fake, fn, known):
    # (fn's output, its launches with each pointer named, its aten calls)
    first = fake.launch_count()
    made = Made(fake)
    with made:
        out = fn()
    launches = fake.launches_since(first)

    def name(p, n):
        for label, t in known.items():
            start = t.data_ptr()
            if t.numel() and start <= p < start + t.numel() * t.element_size():
                return (label, p - start)
        for k in range(len(made.made) - 1, -1, -1):  # the newest output that holds it (its memory is live)
            when, start, end = made.made[k]
            if when <= n and start <= p < end:
                return ("made", k, p - start)
        return p

    named = [(l.function, l.grid, l.block, l.shared, l.stream, tuple(name(p, first + i) for p in l.params))
             for i, l in enumerate(launches)]
    return out, named, made.ops


def layers_of(dtype, n, heads=HEADS, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = lambda *shape: (torch.randn(*shape, generator=g) * 0.1).to(dtype)
    out = []
    for _ in range(n):
        w = encoder.LayerWeights(t(3 * H, H), t(3 * H), t(H, H), t(H), 1 + t(H), t(H), t(F, H), t(F), t(H, F), t(H),
                                 1 + t(H), t(H))
        out.append((w, heads, (1e-12, 1e-5), "none"))
    return out


def case(layout, dtype, lengths, seq):
    batch = len(lengths)
    mask = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]
    padded = torch.randn(batch, seq, H).to(dtype)
    if layout == "varlen":
        cu = torch.nn.functional.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)
        return padded[mask], None, cu, seq
    return padded, (mask if layout == "masked" else None), None, None


def run(stack, hidden, mask, cu, max_seqlen, keep=False):
    with torch.no_grad():
        return encoder.layers_forward(hidden, stack, mask, cu, max_seqlen, None, "triton", keep)


def check(fake, stack, hidden, mask, cu, max_seqlen, keep=False):
    # the C++ route (registered) against the Python route: the same launches, aten calls, outputs
    known = {"x": hidden, "sink": kernels.sink(1, hidden.device)}
    known.update({f"w{i}.{j}": t for i, (w, *_) in enumerate(stack) for j, t in enumerate(w)})
    if mask is not None:
        known["mask"] = mask
    if cu is not None:
        known["cu"] = cu
    with launches_recorded() as record:
        got, launched, ops = traced(fake, lambda: run(stack, hidden, mask, cu, max_seqlen, keep), known)
    assert not record, "the Python route ran"
    with cuda_stack.python_route():
        want, wanted, want_ops = traced(fake, lambda: run(stack, hidden, mask, cu, max_seqlen, keep), known)
    assert len(launched) == len(wanted) and launched, (len(launched), len(wanted))
    for i, (a, b) in enumerate(zip(launched, wanted)):
        assert a == b, (i, a, b)
    assert ops == want_ops, (ops, want_ops)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    return len(launched)


def program(dtype, layout):
    # the post-LN program of that dtype and layout
    return next(entry[0] for key, entry in cuda_stack._PROGRAMS.items()
                if entry and key[0] == "post" and key[3] == dtype and key[-1][0] == layout)


with stand_in_driver(record=True, kernels=fastbert_jit_kernels(), real_launcher=True, cpu_route=True) as fake:
    for layout, dtype in (("varlen", torch.float32), ("masked", torch.float32), ("varlen", torch.float16),
                          ("masked", torch.float16)):
        stack = layers_of(dtype, 3)
        args = case(layout, dtype, [5, 8, 7], 8)
        first = run(stack, *args)  # compiled by the JIT, launched from Python, registered
        with launches_recorded() as record:
            second = run(stack, *args)
        assert not record, (layout, dtype, "not launched from C++")
        assert all(torch.equal(a, b) for a, b in zip(first, second))
        per_layer = 5 if layout == "masked" else 4
        assert check(fake, stack, *args) == 3 * per_layer, layout
        assert check(fake, stack, *args, keep=True) == 3 * per_layer, layout
        # another stack of the same kind (other weights, eps, depth) takes the same program
        other = layers_of(dtype, 2, seed=1)
        other[1] = (other[1][0], HEADS, (1e-6, 1e-7), "none")
        assert check(fake, other, *args) == 2 * per_layer
        print(layout, dtype, "ok")

    # values of another class (16 rows: divisible by 16) miss, run in Python and register a variant each
    stack = layers_of(torch.float32, 2)
    args = case("varlen", torch.float32, [8, 8], 8)
    before = [program(torch.float32, "varlen").variants(i) for i in range(4)]
    run(stack, *args)
    after = [program(torch.float32, "varlen").variants(i) for i in range(4)]
    assert all(b >= 1 for b in before) and after != before, (before, after)
    assert check(fake, stack, *args) == 8
    assert check(fake, stack, *case("varlen", torch.float32, [5, 8, 7], 8)) == 8  # the first class still there

    # stacks the C++ does not take run in Python, every call: layers that differ in heads, a layer without
    # a bias, a padded batch with no mask (whose attention the launchers make, unbound)
    mixed = layers_of(torch.float32, 2)
    mixed[1] = (mixed[1][0], 2, *mixed[1][2:])
    no_bias = layers_of(torch.float32, 2)
    no_bias[0] = (no_bias[0][0]._replace(norm1_bias=None), *no_bias[0][1:])
    varlen = case("varlen", torch.float32, [5, 8, 7], 8)
    for stack, args in ((mixed, varlen), (no_bias, varlen), (layers_of(torch.float32, 2),
                                                              case("padded", torch.float32, [8, 8, 8], 8))):
        for _ in range(2):
            with launches_recorded() as record:
                run(stack, *args)
            assert record, "launched from C++"

    # a launch hook set (a profiler's) sees every launch: the registered stack runs in Python meanwhile
    import triton

    stack = layers_of(torch.float32, 2)
    run(stack, *varlen)
    hooked = []
    triton.knobs.runtime.launch_enter_hook = lambda metadata: hooked.append(metadata)
    try:
        run(stack, *varlen)
    finally:
        triton.knobs.runtime.launch_enter_hook = None
    assert len(hooked) == 8, len(hooked)
    with launches_recorded() as record:
        run(stack, *varlen)
    assert not record

    # pre-LN layers (ModernBERT's): global and local ones with their rotary bases, layer 0 with no attention
    # norm, no biases; every launch of the stack its own
    from fastbert.ops.attention import rotary_for

    def prenorm_layers(dtype, windows, seed=0):
        g = torch.Generator().manual_seed(seed)
        t = lambda *shape: (torch.randn(*shape, generator=g) * 0.1).to(dtype)
        out = []
        for i, window in enumerate(windows):
            w = encoder.PreNormLayerWeights(None if i == 0 else 1 + t(H), None, t(3 * H, H), None, t(H, H), None,
                                            1 + t(H), None, t(2 * F, H), None, t(H, F), None)
            out.append((w, HEADS, (1e-5, 1e-5), "tanh", 160000.0 if window < 0 else 10000.0, window))
        return out

    def prenorm_run(stack, hidden, mask, cu, max_seqlen):
        with torch.no_grad():
            return encoder.prenorm_layers_forward(hidden, stack, mask, cu, max_seqlen, "triton")

    def prenorm_check(stack, args, seq):
        # the C++ route (registered) against the Python route: the same launches and aten calls (the values
        # are not compared: the kernels do not run here, and the GeGLU writes fresh memory) -> launches
        known = {"x": args[0], "sink": kernels.sink(1, "cpu")}
        known.update({f"w{i}.{j}": t for i, (w, *_) in enumerate(stack) for j, t in enumerate(w) if t is not None})
        for base in (160000.0, 10000.0):
            known[f"cos{base}"], known[f"sin{base}"] = rotary_for(base, H // HEADS, seq, "cpu")
        if args[1] is not None:
            known["mask"] = args[1]
        if args[2] is not None:
            known["cu"] = args[2]
        with launches_recorded() as record:
            got, launched, ops = traced(fake, lambda: prenorm_run(stack, *args), known)
        assert not record, "not launched from C++"
        with cuda_stack.python_route():
            want, wanted, want_ops = traced(fake, lambda: prenorm_run(stack, *args), known)
        assert len(launched) == len(wanted), (len(launched), len(wanted))
        for i, (a, b) in enumerate(zip(launched, wanted)):
            assert a == b, (i, a, b)
        assert ops == want_ops
        assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in want]
        return launched

    for layout, dtype, windows in (("varlen", torch.float32, (-1, 2, 2, -1)), ("masked", torch.float32, (-1, 2, 2, -1)),
                                   ("varlen", torch.float16, (-1, 64, 64, -1))):
        stack = prenorm_layers(dtype, windows)
        args = case(layout, dtype, [5, 8, 7], 8)
        prenorm_run(stack, *args)  # compiled, registered
        per_layer = 5 if layout == "masked" else 4
        assert len(prenorm_check(stack, args, 8)) == 4 * per_layer - 1, layout
        print("prenorm", layout, dtype, "ok")

    # a local window that covers every sequence of one call (its layers then attend globally) and not of
    # another (local): kernels of their own, each launched from C++ where the Python route launches it
    stack = prenorm_layers(torch.float32, (-1, 6, 6, -1))
    functions = {}
    for lengths, seq in (([5, 6, 7], 7), ([5, 8, 7], 8), ([5, 6, 7], 7)):
        args = case("varlen", torch.float32, lengths, seq)
        prenorm_run(stack, *args)
        functions[seq] = [launch[0] for launch in prenorm_check(stack, args, seq)]
    assert functions[7] != functions[8]

    # a model's layers take it: BertModel on the Triton backend, a padded batch with its mask (unpadded once)
    from fastbert.model.bert import BertModel
    from fastbert.model.config import BertConfig

    ids = torch.randint(5, 100, (3, 8))
    mask = (torch.arange(8)[None, :] < torch.tensor([5, 8, 7])[:, None]).long()

    def model_routes(model, layer_launches):
        # the model's launches both ways: the same, its layers' from C++ (the model's own around them from Python)
        launches, recorded = {}, {}
        for route in ("python", "cpp"):
            with torch.no_grad(), (cuda_stack.python_route() if route == "python" else contextlib.nullcontext()):
                for _ in range(2):
                    model(input_ids=ids, attention_mask=mask)
                first = fake.launch_count()
                with launches_recorded() as record:
                    model(input_ids=ids, attention_mask=mask)
                launches[route] = [(l.function, l.grid) for l in fake.launches_since(first)]
                recorded[route] = len(record)
        assert launches["cpp"] == launches["python"] and len(launches["cpp"]) >= layer_launches, launches
        assert recorded["python"] - recorded["cpp"] == layer_launches, recorded

    config = BertConfig(vocab_size=100, hidden_size=H, num_hidden_layers=3, num_attention_heads=HEADS,
                        intermediate_size=F, max_position_embeddings=64)
    model_routes(BertModel(config, add_pooling_layer=False).set_backend("triton").eval(), 12)

    # and ModernBERT's: its 3 layers' 11 launches
    from fastbert.model.config import ModernBertConfig
    from fastbert.model.modernbert import ModernBertModel

    config = ModernBertConfig(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                              sep_token_id=2, hidden_size=H, num_hidden_layers=3, num_attention_heads=HEADS,
                              intermediate_size=96, max_position_embeddings=64)
    model_routes(ModernBertModel(config).set_backend("triton").eval(), 11)
print("ok")
"""


def test_cuda_stack_launches_what_the_python_route_launches(tmp_path):
    script_ends_ok(tmp_path, "cuda_stack.py", _SCRIPT)


def test_no_driver_no_cuda_stack():
    # on a machine with no CUDA driver (here, under the interpreter) the layers take their Python route
    import torch

    from fastbert.kernels import driver_launch_address
    from fastbert.ops import cuda_stack

    if driver_launch_address():
        pytest.skip("a CUDA driver is loaded here")
    x = torch.zeros(4, 64)
    assert cuda_stack.stack(x, x.shape, [], None, None, None, False, lambda: [x]) is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_stack_on_gpu_equals_the_python_route(dtype):
    # on a GPU the launches run: BERT's and ModernBERT's stacks, launched from C++, give the Python
    # route's outputs bit for bit (the same kernels and GEMMs on the same stream), packed and with a mask
    from functools import partial

    import torch

    if not torch.cuda.is_available():
        pytest.skip("launching from C++ needs a GPU (the launches are checked without one above)")
    from fastbert import backend as fb_backend
    from fastbert.kernels import launches_recorded
    from fastbert.ops import cuda_stack, encoder

    if fb_backend.cpp_function("post_ln_stack") is None:
        pytest.skip("the C++ extension is not built here (run_cuda.sh builds it)")
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    t = lambda *shape: (torch.randn(*shape, generator=g) * 0.1).to("cuda", dt)  # noqa: E731
    hidden, heads = 256, 4
    post = [(encoder.LayerWeights(t(768, 256), t(768), t(256, 256), t(256), 1 + t(256), t(256), t(1024, 256),
                                  t(1024), t(256, 1024), t(256), 1 + t(256), t(256)), heads, (1e-12, 1e-12), "none")
            for _ in range(3)]
    pre = [(encoder.PreNormLayerWeights(None if i == 0 else 1 + t(256), None, t(768, 256), None, t(256, 256), None,
                                        1 + t(256), None, t(768, 256), None, t(256, 384), None), heads, (1e-5, 1e-5),
            "tanh", 160000.0 if i % 3 == 2 else 10000.0, -1 if i % 3 == 2 else 32) for i in range(3)]
    lengths = torch.tensor([37, 128, 90, 5])
    mask = (torch.arange(128)[None, :] < lengths[:, None]).cuda()
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to("cuda", torch.int32)
    padded = t(4, 128, hidden)
    routes = {"packed": (padded[mask], None, cu, 128), "masked": (padded, mask, None, None)}
    runs = {}
    for name, (state, key_mask, cu_seqlens, max_seqlen) in routes.items():
        runs["post", name] = partial(encoder.layers_forward, state, post, key_mask, cu_seqlens, max_seqlen, None,
                                     "triton", True)
        runs["pre", name] = partial(encoder.prenorm_layers_forward, state, pre, key_mask, cu_seqlens, max_seqlen,
                                    "triton")
    with torch.no_grad():
        for what, run in runs.items():
            with cuda_stack.python_route():
                want = run()
            run()  # registers
            with launches_recorded() as record:
                got = run()
            assert not record, (what, "not launched from C++")
            for a, b in zip(got, want):
                assert torch.equal(a, b), (what, (a.float() - b.float()).abs().max().item())
