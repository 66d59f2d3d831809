"""fastbert's C++ kernels at each instruction-set level this CPU runs, in one process on the same data:
the fused ops, attention, the int8 GEMM (full-range weights, and weights in [-64, 64], the range an
older avx2 kernel needed) and the whole BERT-base encoder (fp32, and int8 on fastbert's own int8
GEMM, its weights in [-127, 127]), the levels called
in turn round after round (fastbert.backend.cpu_capability_scope switches the kernel library).
torch's own kernels and GEMMs are not capped: in the fp32 encoder only fastbert's kernels change
with the level.

With a `native` level (a build with FASTBERT_CPU_ARCH=native: the same kernels compiled with
-march=native for this machine) the last column compares it with the best dispatched level: what
the portable build gives up against one compiled for the machine.

    python benchmarks/bench_levels.py [--rounds 5] [--layers 12] [--levels avx2,avx512_vnni]
"""
from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastbert  # noqa: E402
import fastbert.backend  # noqa: E402
from fastbert.bench.report import command_line, header, parser  # noqa: E402
from fastbert.bench.timing import interleaved_cpu_times  # noqa: E402
from fastbert.bench.workloads import WORKLOADS, base_config, make_batch  # noqa: E402
from fastbert.ops import gemm  # noqa: E402


def op_cases(g):
    """{name: fn} of single ops on BERT-base-sized inputs (fp32)."""
    x, b = torch.randn(4096, 3072, generator=g), torch.randn(3072, generator=g)
    h, r = torch.randn(4096, 768, generator=g), torch.randn(4096, 768, generator=g)
    w, lb = 1 + 0.1 * torch.randn(768, generator=g), torch.randn(768, generator=g)
    dy = torch.randn(4096, 768, generator=g)
    mask = make_batch(**WORKLOADS["var128"], g=g)[1]
    q, k, v = (torch.randn(*mask.shape, 12, 64, generator=g) for _ in range(3))
    packed = [fastbert.ops.unpad(t, mask) for t in (q, k, v)]
    (qp, _, cu, mx), (kp, *_), (vp, *_) = packed
    a8 = torch.randint(-128, 128, (int(mask.sum()) + 1, 768), generator=g, dtype=torch.int8)
    w8 = torch.randint(-127, 128, (3072, 768), generator=g, dtype=torch.int8)
    w7 = torch.randint(-64, 65, (3072, 768), generator=g, dtype=torch.int8)  # the narrow weights (avx2's vpmaddubsw)
    acc, xs, xo = fastbert.ops.int8_matmul(a8, w8), torch.rand(a8.shape[0] - 1, generator=g), torch.randn(a8.shape[0] - 1)
    ws, bi = torch.rand(3072, generator=g) * 1e-3, torch.randn(3072, generator=g)
    ln = [h, r, w, lb]

    def ln_fwd_bwd():
        leaves = [t.clone().requires_grad_(True) for t in ln]
        fastbert.ops.add_layer_norm(*leaves).backward(dy)

    def int8_gemm(w):
        with gemm.forced("fastbert"):
            fastbert.ops.int8_matmul(a8, w)

    return {
        "bias_gelu 4096x3072": lambda: fastbert.ops.bias_gelu(x, b),
        "add_layer_norm 4096x768": lambda: fastbert.ops.add_layer_norm(*ln),
        "add_layer_norm fwd+bwd": ln_fwd_bwd,
        "varlen_attention var128": lambda: fastbert.ops.varlen_attention(qp, kp, vp, cu, mx),
        f"int8 GEMM {a8.shape[0]}x768x3072": lambda: int8_gemm(w8),
        "... weights in [-64, 64]": lambda: int8_gemm(w7),
        "int8_bias_gelu": lambda: fastbert.ops.int8_bias_gelu(acc, xs, xo, ws, bi),
    }


def encoder_cases(layers, g):
    """{name: fn}: BERT-base (random weights) on the var128 batch, fp32 and int8 inference."""
    ids, mask = make_batch(**WORKLOADS["var128"], g=g)
    torch.manual_seed(0)
    fp32 = fastbert.BertModel(fastbert.BertConfig(**base_config(layers))).eval()
    int8 = fastbert.BertModel(fastbert.BertConfig(**base_config(layers))).eval()
    int8.load_state_dict(fp32.state_dict())
    int8.quantize_("int8")

    def run(model, path=None):
        with torch.inference_mode(), gemm.forced(path):
            model(ids, mask)

    # int8 on fastbert's own GEMM, whose speed is the level's (torch._int_mm is not fastbert's to cap)
    return {f"encoder fp32 var128 ({layers} layers)": lambda: run(fp32),
            f"encoder int8 var128 ({layers} layers)": lambda: run(int8, "fastbert")}


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--levels", default=None, help="comma-separated (default: every level this CPU runs)")
    args = ap.parse_args(argv)
    runnable = fastbert.backend.cpu_capabilities()
    if not runnable:
        print("the C++ extension is not built: there are no kernel levels to time", file=sys.stderr)
        return 2
    levels = runnable if args.levels is None else args.levels.split(",")
    if any(lv not in runnable for lv in levels):
        ap.error(f"levels {[lv for lv in levels if lv not in runnable]} do not run here; choose from {runnable}")
    header(command_line(argv), levels=levels)
    g = torch.Generator().manual_seed(0)
    cases = {**op_cases(g), **encoder_cases(args.layers, g)}
    fns = {}
    for level in levels:
        for name, fn in cases.items():
            def call(fn=fn, level=level):
                with fastbert.backend.cpu_capability_scope(level):
                    fn()
            fns[(name, level)] = call
    times = interleaved_cpu_times(fns, warmup=1, repeats=args.rounds)
    med = {key: statistics.median(t) for key, t in times.items()}
    dispatched = [lv for lv in levels if lv != "native"]
    native = "native" in levels
    print(f"{'median ms':<34}" + "".join(f"{lv:>13}" for lv in levels) + ("   native / best dispatched" if native else ""))
    for name in cases:
        row = f"{name:<34}" + "".join(f"{med[(name, lv)] * 1e3:>13.2f}" for lv in levels)
        if native and dispatched:
            best = min(med[(name, lv)] for lv in dispatched)
            row += f"{med[(name, 'native')] / best:>26.3f}x"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
