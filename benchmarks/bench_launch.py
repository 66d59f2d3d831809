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
    from triton.runtime.jit import JITFunction

    from fastbert import kernels
    from fastbert.bench.launch import stand_in_driver
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

    jitted = [v for name, module in list(sys.modules.items()) if name.startswith("fastbert.kernels")
              for v in vars(module).values() if isinstance(v, JITFunction)]
    with stand_in_driver(record=False, kernels=jitted, real_launcher=True) if not cuda else contextlib.nullcontext():
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

    def show(rows):
        print(f"# {'wall us a call on ' + torch.cuda.get_device_name() if cuda else 'host us a call, launches not run'}")
        print(f"{'call (launches)':34}{'JIT us':>10}{'direct us':>11}{'JIT / direct':>14}")
        for r in rows:
            print(f"{r['call']:34}{r['jit_us']:10.1f}{r['direct_us']:11.1f}{r['ratio']:13.2f}x")

    finish(rows, show, argv, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
