"""What a Triton launch costs the host up to the driver, through Triton's JIT and through
kernels.DirectLaunch (a Bound's compiled kernel launched with the arguments the JIT would give it),
measured on any CPU with no GPU: Triton's JIT runs for real against a stand-in driver
(fastbert.bench.launch: the kernels compiled for sm_90 at the first call), down to Triton's own
launcher (its Python and its C) and a stand-in libcuda whose cuLaunchKernelEx returns at once, so
all of the host's work but the driver's own is timed. The calls, a BERT-base layer's
inference launches (fp16, 8 x 64 tokens): the attention over its joined QKV rows
(kernels.attention.qkv_attention_forward, Bound launches), padded with a key mask (two launches:
the mask's ranges, the attention) and packed (one); add + LayerNorm and bias + GELU written over
their inputs as a layer calls them (add_layer_norm_inference, bias_gelu_inference: Bound
launches). Both ways in turn, fastest round kept. Prints host us per call each way and the ratio.
bench_host.py, by contrast, skips every launch (its own us are the Python around them).

On a GPU, `--device cuda` launches for real, the calls back to back with the GPU kept busy: wall
us a call, the larger of the host's time and the GPU's (at these sizes, the host's).

    python benchmarks/bench_launch.py [--device stand-in|cuda] [--calls 500] [--rounds 7] [--json PATH]
"""
from __future__ import annotations

import os
import sys
import time

from fastbert.bench.report import add_output_options, finish, parser


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--calls", type=int, default=500, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds each way, in turn (the fastest is kept)")
    ap.add_argument("--device", choices=("stand-in", "cuda"), default="stand-in",
                    help="stand-in: no GPU, a stand-in libcuda under Triton's launcher (host us); cuda: real launches "
                         "on the GPU, wall us a call with the calls back to back (the larger of the host's and the "
                         "GPU's time)")
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("# skipped: TRITON_INTERPRET=1 (the interpreter compiles nothing); run without it")
        return 0
    try:
        import triton  # noqa: F401
    except ImportError:
        print("# skipped: triton is not installed (pip install triton)")
        return 0
    import contextlib

    import torch

    from fastbert import kernels
    from fastbert.bench.launch import fastbert_jit_kernels, stand_in_driver
    from fastbert.kernels import attention, bias_gelu, layer_norm

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("# skipped: --device cuda needs a GPU")
        return 0
    dev = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    batch, seq, hidden, heads = 8, 64, 768, 12
    qkv = torch.randn(batch * seq, 3 * hidden, dtype=torch.float16, device=dev)
    mask = torch.ones(batch, seq, dtype=torch.bool, device=dev)
    mask[1:, 40:] = False
    lengths = mask.sum(1, dtype=torch.int32)
    cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    packed = qkv[: int(cu[-1])].clone()
    rows = torch.randn(batch * seq, hidden, dtype=torch.float16, device=dev)
    residual, weight, bias = torch.randn_like(rows), torch.ones(hidden, device=dev), torch.zeros(hidden, device=dev)
    inter = torch.randn(batch * seq, 4 * hidden, dtype=torch.float16, device=dev)
    inter_bias = torch.zeros(4 * hidden, device=dev)
    calls = {"attention, padded, key mask (2)": lambda: attention.qkv_attention_forward(qkv, heads, mask, None, seq, 0.125),
             "attention, packed (1)": lambda: attention.qkv_attention_forward(packed, heads, None, cu, seq, 0.125),
             "add_layer_norm, inference (1)": lambda: layer_norm.add_layer_norm_inference(
                 rows, residual, weight, bias, 1e-12),
             "bias_gelu, inference (1)": lambda: bias_gelu.bias_gelu_inference(inter, inter_bias, "none")}
    direct = kernels.DirectLaunch.__call__

    def jit_only(self, grid, args):
        return False

    def per_call(fn) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.calls * 1e6

    stand_in = contextlib.nullcontext() if cuda else stand_in_driver(
        record=False, kernels=fastbert_jit_kernels(), real_launcher=True, cpu_route=True)
    with stand_in:
        for fn in calls.values():  # compiled (sm_90) and kept for direct launches
            fn()
            fn()
        best = {(name, way): float("inf") for name in calls for way in ("jit", "direct")}
        try:
            for _ in range(args.rounds):
                for name, fn in calls.items():
                    for way in ("jit", "direct"):
                        kernels.DirectLaunch.__call__ = jit_only if way == "jit" else direct
                        best[name, way] = min(best[name, way], per_call(fn))
        finally:
            kernels.DirectLaunch.__call__ = direct
        rows = [dict(call=name, jit_us=best[name, "jit"], direct_us=best[name, "direct"],
                     ratio=best[name, "jit"] / best[name, "direct"]) for name in calls]
        rows += _layer_rows(dev, per_call, args.rounds)

    def show(rows):
        print(f"# {'wall us a call on ' + torch.cuda.get_device_name() if cuda else 'host us a call, launches not run'}")
        print(f"{'call (launches)':34}{'JIT us':>10}{'direct us':>11}{'JIT / direct':>14}")
        for r in rows:
            if "call" in r:
                print(f"{r['call']:34} {r['jit_us']:9.1f} {r['direct_us']:10.1f} {r['ratio']:12.2f}x")
        print(f"# a layer: half of a 3-layer stack less a 1-layer one ({LAYER_SIZES}); floor: its aten calls alone")
        print(f"{'layer (launches)':40}{'Python us':>10}{'C++ us':>9}{'Python / C++':>14}{'floor us':>10}"
              f"{'own Py':>8}{'own C++':>9}")
        for r in rows:
            if "layer" in r:
                # a space before each figure: at a few calls a layer's us (a difference of two times) can be
                # near zero or below, and its ratio wider than its column, which must not run into the next
                print(f"{r['layer']:40} {r['python_us']:9.1f} {r['cpp_us']:8.1f} {r['ratio']:12.2f}x"
                      f" {r['floor_us']:9.1f} {r['python_us'] - r['floor_us']:7.1f} {r['cpp_us'] - r['floor_us']:8.1f}")

    finish(rows, show, argv, json_path=args.json)
    return 0


# the layer stacks' sizes: small, so that the torch calls' arithmetic (a GPU's work) costs the host's
# CPU next to nothing here (bench_host.py's timed sizes)
LAYER_SIZES = ("hidden 64, 4 heads, FFN 128 (BERT) / 96 (ModernBERT's GeGLU); 2 sequences of 5 and 8 tokens; "
               "ModernBERT's third layer global, the others local")


def _layer_rows(dev, per_call, rounds: int) -> list:
    """BERT's post-LN and ModernBERT's pre-LN layer stacks through fastbert.ops.encoder's inference
    routes, the Python route (its launches direct) and the C++ one (fastbert.ops.cuda_stack), packed
    and padded with a key mask: host us a layer each way and the floor (the stack's aten calls
    replayed alone), in turn, fastest kept."""
    import contextlib

    import torch

    from fastbert.bench.host import aten_replay, denormals_flushed
    from fastbert.kernels import launches_recorded
    from fastbert.ops import cuda_stack, encoder

    dtype = torch.float16 if dev == "cuda" else torch.float32  # the CPU's fp16 GEMMs are slow: its floor
    hidden, heads = 64, 4
    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return (torch.randn(*shape, generator=g) * 0.1).to(dev, dtype)

    def bert_layer(i):
        ones, zeros = 1 + t(hidden), t(hidden)
        weights = encoder.LayerWeights(t(3 * hidden, hidden), t(3 * hidden), t(hidden, hidden), t(hidden), ones, zeros,
                                       t(128, hidden), t(128), t(hidden, 128), t(hidden), ones, zeros)
        return weights, heads, (1e-12, 1e-12), "none"

    def modern_layer(i):  # ModernBERT's: no biases, layer 0 without an attention norm, every third global
        weights = encoder.PreNormLayerWeights(None if i == 0 else 1 + t(hidden), None, t(3 * hidden, hidden), None,
                                              t(hidden, hidden), None, 1 + t(hidden), None, t(192, hidden), None,
                                              t(hidden, 96), None)
        window = -1 if i % 3 == 2 else 2
        return weights, heads, (1e-5, 1e-5), "tanh", 160000.0 if window < 0 else 10000.0, window

    mask = torch.tensor([[True] * 5 + [False] * 3, [True] * 8], device=dev)
    cu = torch.tensor([0, 5, 13], dtype=torch.int32, device=dev)
    padded = t(2, 8, hidden)
    layouts = {"packed": (padded[mask], None, cu, 8), "padded, key mask": (padded, mask, None, None)}
    families = {"BERT": ([bert_layer(i) for i in range(3)], (4, 5), lambda *a: encoder.layers_forward(
                    *a, None, "triton", False)),
                "ModernBERT": ([modern_layer(i) for i in range(3)], (4, 5), lambda *a: encoder.prenorm_layers_forward(
                    *a, "triton"))}
    rows = []
    for family, (stack, launches, forward) in families.items():
        for (name, (state, key_mask, cu_seqlens, max_seqlen)), n_launches in zip(layouts.items(), launches):
            def call(n, state=state, key_mask=key_mask, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                     forward=forward, stack=stack):
                return lambda: forward(state, stack[:n], key_mask, cu_seqlens, max_seqlen)

            calls = {n: call(n) for n in (1, 3)}
            best = {}
            # the kernels do not run against the stand-in: what they would write holds whatever the memory
            # held, which as denormal floats slows the CPU's GEMMs by factors (on a GPU that work is off the host)
            flushed = denormals_flushed() if dev != "cuda" else contextlib.nullcontext()
            with torch.no_grad(), flushed:
                for fn in calls.values():
                    for _ in range(2):  # compiled, kept, registered for the C++ launches
                        fn()
                    with launches_recorded() as record:
                        fn()
                    if record:
                        raise RuntimeError(f"fastbert: the C++ launches did not take the {family} {name} stack")
                floors = {n: aten_replay(fn) for n, fn in calls.items()}
                for _ in range(rounds):
                    for n, fn in calls.items():
                        with cuda_stack.python_route():
                            best["python", n] = min(best.get(("python", n), float("inf")), per_call(fn))
                        best["cpp", n] = min(best.get(("cpp", n), float("inf")), per_call(fn))
                        best["floor", n] = min(best.get(("floor", n), float("inf")), per_call(floors[n]))
            layer = {way: (best[way, 3] - best[way, 1]) / 2 for way in ("python", "cpp", "floor")}
            rows.append(dict(layer=f"{family} layer, {name} ({n_launches})", python_us=layer["python"],
                             cpp_us=layer["cpp"], floor_us=layer["floor"], ratio=layer["python"] / layer["cpp"]))
    return rows


if __name__ == "__main__":
    sys.exit(main())
