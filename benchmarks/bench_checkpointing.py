"""Gradient checkpointing on a BERT-base training step: the activations autograd keeps for the
backward (counted through saved-tensor hooks: every tensor an op saves) and the step's time, with
and without model.gradient_checkpointing_enable(), on the same batch and weights.

    python benchmarks/bench_checkpointing.py [--batch 8] [--seq 128] [--rounds 3]
"""
import argparse
import statistics

import torch

import fastbert
from fastbert.bench.report import command_line, header
from fastbert.bench.timing import interleaved_cpu_times


def step(model, ids, mask, labels, counter=None):
    def pack(t):
        if counter is not None:
            counter[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, mask, labels=labels).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    header(command_line(argv))
    torch.manual_seed(0)
    plain = fastbert.BertForSequenceClassification(fastbert.BertConfig(num_labels=2)).train()
    ckpt = fastbert.BertForSequenceClassification(fastbert.BertConfig(num_labels=2)).train()
    ckpt.load_state_dict(plain.state_dict())
    ckpt.gradient_checkpointing_enable()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (args.batch, args.seq), generator=g)
    lengths = torch.randint(args.seq // 2, args.seq + 1, (args.batch,), generator=g)
    mask = (torch.arange(args.seq)[None] < lengths[:, None]).long()
    labels = torch.randint(0, 2, (args.batch,), generator=g)
    saved = {}
    for name, model in (("without", plain), ("with", ckpt)):
        counter = [0]
        step(model, ids, mask, labels, counter)
        saved[name] = counter[0]
    times = interleaved_cpu_times({"without": lambda: step(plain, ids, mask, labels),
                                   "with": lambda: step(ckpt, ids, mask, labels)}, warmup=1, repeats=args.rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    real = int(mask.sum())
    print(f"BERT-base, batch {args.batch} x {args.seq} ({real} real tokens), fp32, training step")
    print(f"{'checkpointing':<15}{'saved activations MiB':>23}{'step s':>9}")
    for name in ("without", "with"):
        print(f"{name:<15}{saved[name] / 2**20:>23.1f}{med[name]:>9.2f}")
    print(f"activations: {saved['without'] / saved['with']:.1f}x less with checkpointing; "
          f"step time: {med['with'] / med['without']:.2f}x (each layer's forward runs twice)")


if __name__ == "__main__":
    main()
