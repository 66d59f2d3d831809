"""Fine-tuning steps per second: fastbert's BertForSequenceClassification against transformers' on
the same data, weights and seed. One step = forward, loss, backward and an AdamW step (lr 2e-5, the
original BERT recipe's range; torch's fused AdamW, transformers.Trainer's default optimizer
"adamw_torch_fused"), in fp32 and under bf16 autocast (what Trainer(bf16=True) does).

    python benchmarks/bench_finetune.py [--batch-size 16] [--lengths 16,128] [--layers 12] [--rounds 5]

Batches: `batches` distinct batches of random ids, lengths uniform in the --lengths range, padded to
the batch's longest (variable-length batches, as a DataCollatorWithPadding makes them); the two
models are stepped in turn, round after round, and each figure is the median of its rounds.
"""
import contextlib
import copy
import statistics

import torch

import fastbert
from fastbert.bench import report
from fastbert.bench.timing import interleaved_cpu_times
from fastbert.bench.workloads import base_config
from fastbert.dtypes import parse_dtype


def make_batches(n, batch_size, lo, hi, g):
    out = []
    for _ in range(n):
        lengths = torch.randint(lo, hi + 1, (batch_size,), generator=g)
        seq = int(lengths.max())
        mask = (torch.arange(seq)[None] < lengths[:, None]).long()
        ids = torch.randint(1000, 30000, (batch_size, seq), generator=g) * mask
        out.append(dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 2, (batch_size,), generator=g)))
    return out


def stepper(model, batches, amp):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    state = {"i": 0}

    def step():
        b = batches[state["i"] % len(batches)]
        state["i"] += 1
        with torch.autocast("cpu", dtype=amp) if amp is not None else contextlib.nullcontext():
            loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(dtype_name, layers, batches, rounds):
    import transformers

    amp = None if dtype_name == "fp32" else parse_dtype(dtype_name)
    torch.manual_seed(0)
    theirs = transformers.BertForSequenceClassification(
        transformers.BertConfig(**base_config(layers), num_labels=2, attn_implementation="sdpa")).train()
    ours = fastbert.BertForSequenceClassification(fastbert.BertConfig(**base_config(layers), num_labels=2)).train()
    ours.load_state_dict(copy.deepcopy(theirs.state_dict()))
    fns = {"transformers": stepper(theirs, batches, amp), "fastbert": stepper(ours, batches, amp)}
    times = interleaved_cpu_times(fns, warmup=1, repeats=rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    real = statistics.mean(int(b["attention_mask"].sum()) for b in batches)
    return [{"dtype": dtype_name, "provider": k, "median_s": v, "steps_per_s": 1 / v, "real_tokens_per_s": real / v,
             "speedup": med["transformers"] / v, "rounds": len(times[k])} for k, v in med.items()]


def print_rows(rows):
    print("| dtype | provider | median s/step | steps/s | real tokens/s | vs transformers |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['dtype']} | {r['provider']} | {r['median_s']:.3f} | {r['steps_per_s']:.3f} | "
              f"{r['real_tokens_per_s']:.0f} | {r['speedup']:.2f}x |")


def main(argv=None):
    ap = report.parser(__doc__)
    ap.add_argument("--dtypes", default="fp32,bf16", help="fp32 and / or an autocast dtype (bf16)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lengths", default="16,128", help="shortest,longest sequence")
    ap.add_argument("--layers", type=int, default=12, help="encoder layers of the BERT-base-shaped model")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    report.add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    try:
        lo, hi = (int(v) for v in args.lengths.split(","))
        dtypes = [d.strip() for d in args.dtypes.split(",")]
        for d in dtypes:
            parse_dtype(d)
    except ValueError as e:
        ap.error(str(e).removeprefix("fastbert: "))
    dtypes = report.without_slow_bf16(dtypes)
    batches = make_batches(args.batches, args.batch_size, lo, hi, torch.Generator().manual_seed(0))
    rows = [r for d in dtypes for r in measure(d, args.layers, batches, args.rounds)]
    report.finish(rows, print_rows, argv, json_path=args.json, batch_size=args.batch_size, lengths=[lo, hi])


if __name__ == "__main__":
    main()
