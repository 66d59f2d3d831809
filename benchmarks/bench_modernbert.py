"""ModernBERT-base (or MPNet-base, --model mpnet) on fastbert against transformers' own model, on
the CPU, same random weights, same batches, in one process.

The model: transformers' ModernBertConfig defaults, which are ModernBERT-base's (22 layers, hidden
768, 12 heads, GeGLU 1152, vocabulary 50,368, a global layer every third with rotary base 160,000,
the others local: a 128-token window, base 10,000), random weights (seeded), eval, fp32; --layers
cuts the depth for a quicker run. transformers runs attn_implementation="sdpa" (its padded path:
q and k rotated in memory, a [seq, seq] mask with the window in it); fastbert runs the cpp backend
(the real tokens packed, rotary and the window inside the attention kernel). --model mpnet:
transformers' MPNetConfig defaults (all-mpnet-base-v2's size: 12 layers, hidden 768, vocabulary
30,527; the relative position bias read by distance inside fastbert's attention kernel), against
transformers' default attention for MPNet (switching its config to "sdpa" after construction
changed its outputs by 0.17 here: the bias was lost); its positions stop at 512 tokens, so one2048
is not run for it.

Workloads (fastbert.bench.workloads): var128 (32 sequences of 16..128 tokens), var512 (8 of
64..512) and one2048 (one sequence of 2048 tokens). Interleaved rounds: each round calls every
provider once on the same batch; medians; every ratio is of times measured in this run. The
outputs are compared at real tokens (max abs error), so a speed-up never hides a wrong answer.

    python benchmarks/bench_modernbert.py [--model modernbert|mpnet] [--workloads var128,var512,one2048]
        [--layers N] [--rounds 5] [--json PATH]
"""
from __future__ import annotations

import statistics

import torch

import fastbert
from fastbert.bench.report import command_line, header, parser, write_json
from fastbert.bench.timing import interleaved_cpu_times
from fastbert.bench.workloads import WORKLOADS, make_batch

MODERN_WORKLOADS = {**{k: WORKLOADS[k] for k in ("var128", "var512")}, "one2048": dict(batch=1, lo=2048, hi=2048)}


MODELS = {"modernbert": ("ModernBertModel", "ModernBertConfig", 22), "mpnet": ("MPNetModel", "MPNetConfig", 12)}


def models(name: str, layers: int):
    """(transformers' model with sdpa where it has it, fastbert's with the same weights), both eval."""
    import transformers

    cls, config_cls, _ = MODELS[name]
    config = getattr(transformers, config_cls)(num_hidden_layers=layers)
    torch.manual_seed(0)
    theirs = getattr(transformers, cls)(config).eval()
    if name == "modernbert":  # MPNet runs transformers' default: its sdpa setting loses the relative bias
        theirs.config._attn_implementation = "sdpa"
    ours = getattr(fastbert, cls)(getattr(fastbert, config_cls)(**config.to_dict())).eval()
    ours.load_state_dict(theirs.state_dict())
    ours.set_backend("cpp")
    return theirs, ours


def run(args) -> list:
    theirs, ours = models(args.model, args.layers)
    vocab, pad = theirs.config.vocab_size, theirs.config.pad_token_id
    rows = []
    for name in args.workloads:
        w = MODERN_WORKLOADS[name]
        ids, mask = make_batch(w["batch"], w["lo"], w["hi"], torch.Generator().manual_seed(1), vocab=vocab, pad_id=pad)
        with torch.inference_mode():
            a = ours(input_ids=ids, attention_mask=mask).last_hidden_state
            b = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
            err = (a - b)[mask.bool()].abs().max().item()
            times = interleaved_cpu_times({
                "fastbert": lambda i=ids, m=mask: ours(input_ids=i, attention_mask=m),
                "transformers": lambda i=ids, m=mask: theirs(input_ids=i, attention_mask=m),
            }, warmup=1, repeats=args.rounds)
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        tokens = int(mask.sum())
        rows.append(dict(workload=name, real_tokens=tokens, ms=ms, speedup=ms["transformers"] / ms["fastbert"],
                         max_abs_err=err, tokens_per_s={k: tokens / v * 1e3 for k, v in ms.items()}))
        print(f"{name:<9}{tokens:>8}{ms['fastbert']:>14.1f}{ms['transformers']:>22.1f}"
              f"{rows[-1]['speedup']:>10.2f}x{err:>14.2e}", flush=True)
    return rows


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--model", default="modernbert", choices=sorted(MODELS))
    ap.add_argument("--workloads", default=None, help=f"of {', '.join(MODERN_WORKLOADS)} (default: all the model takes)")
    ap.add_argument("--layers", type=int, default=None, help="default: the model's base depth (22, 12)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.layers = args.layers or MODELS[args.model][2]
    default = "var128,var512" if args.model == "mpnet" else ",".join(MODERN_WORKLOADS)
    args.workloads = [w for w in (args.workloads or default).split(",") if w]
    unknown = [w for w in args.workloads if w not in MODERN_WORKLOADS]
    if unknown:
        ap.error(f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(MODERN_WORKLOADS)}")
    cmd = command_line(argv, "python benchmarks/bench_modernbert.py" if argv is not None else None)
    info = header(cmd, model=args.model, layers=args.layers, dtype="float32")
    print(f"{'workload':<9}{'tokens':>8}{'fastbert ms':>14}{'transformers ms':>22}{'speedup':>11}{'max abs err':>14}")
    rows = run(args)
    if args.json:
        write_json(args.json, cmd, info, rows)


if __name__ == "__main__":
    main()
