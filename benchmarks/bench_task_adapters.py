"""What jina-embeddings-v3's task adapters cost on the CPU: the model at its real widths (hidden 1024,
16 heads, FFN 4096, rank-4 adapters for its five tasks; --layers of its 24 layers, random weights
and random adapters; a 30,000-token vocabulary, as the embedding table's size takes no part in the
time), on one batch of a workload, run five ways in interleaved rounds:

- folded: one task folded into the weights at load (from_pretrained(..., task=)): every inference
  route; the baseline of the ratios;
- per call: the same task chosen per call (task=...): each linear layer's low-rank side product, the
  layers one by one;
- per row: each row its own task, the five in turn (task=[...]);
- no task: the encoder without adapters (what the model runs without task=);
- transformers: transformers' JinaEmbeddingsV3Model on the folded weights (it has no adapters).

Before timing, each way's last hidden state at the real tokens against transformers' on the folded
weights of each row's task (max abs error).

    python benchmarks/bench_task_adapters.py [--workloads var128,var512] [--layers 4] [--rounds 5]
"""
from __future__ import annotations

import statistics
import sys
import tempfile

import torch

import fastbert
from fastbert.bench.report import command_line, header, parser
from fastbert.bench.timing import interleaved_cpu_times
from fastbert.bench.workloads import WORKLOADS, make_batch

TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
REAL = dict(vocab_size=30000, hidden_size=1024, num_attention_heads=16, intermediate_size=4096,
            max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def build(layers: int, directory: str):
    """(fastbert's model with adapters, {task index: transformers' model on that task's folded weights},
    the folded fastbert model of task 0): the adapters random (B as well: a trained model's are not zero)."""
    import transformers

    torch.manual_seed(0)
    cfg = fastbert.JinaEmbeddingsV3Config(**REAL, num_hidden_layers=layers, lora_adaptations=TASKS, lora_rank=4,
                                          lora_alpha=1)
    ours = fastbert.JinaEmbeddingsV3Model(cfg).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith(("lora_A", "lora_B")):
                p.normal_(0, 0.05)
    ours.save_pretrained(directory)
    theirs = {}
    for t in range(len(TASKS)):
        folded = fastbert.JinaEmbeddingsV3Model.from_pretrained(directory, task=TASKS[t])
        folded.save_pretrained(f"{directory}/folded{t}")
        theirs[t] = transformers.JinaEmbeddingsV3Model.from_pretrained(f"{directory}/folded{t}").eval()
    return ours, theirs, fastbert.JinaEmbeddingsV3Model.from_pretrained(directory, task=TASKS[0])


def measure(name: str, ours, theirs, folded, rounds: int) -> None:
    """One workload's rows: each way's time, its ratio to the folded model's, its error."""
    w = WORKLOADS[name]
    ids, mask = make_batch(w["batch"], w["lo"], w["hi"], torch.Generator().manual_seed(1), vocab=REAL["vocab_size"],
                           pad_id=1)
    rows = [TASKS[b % len(TASKS)] for b in range(ids.shape[0])]
    ways = {
        "folded": lambda: folded(input_ids=ids, attention_mask=mask),
        "per call": lambda: ours(input_ids=ids, attention_mask=mask, task=TASKS[0]),
        "per row": lambda: ours(input_ids=ids, attention_mask=mask, task=rows),
        "no task": lambda: ours(input_ids=ids, attention_mask=mask),
        "transformers": lambda: theirs[0](input_ids=ids, attention_mask=mask),
    }
    real = mask.bool()
    want = theirs[0](input_ids=ids, attention_mask=mask).last_hidden_state
    per_row = torch.stack([theirs[b % len(TASKS)](input_ids=ids[b:b + 1], attention_mask=mask[b:b + 1])
                           .last_hidden_state[0] for b in range(ids.shape[0])])
    err = {k: (fn().last_hidden_state - (per_row if k == "per row" else want))[real].abs().max().item()
           for k, fn in ways.items() if k != "no task"}
    times = interleaved_cpu_times(ways, warmup=1, repeats=rounds)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for k in ways:
        e = f"{err[k]:.1e}" if k in err else "-"
        print(f"{name:<10} {int(mask.sum()):>11}  {k:<12} {ms[k]:>8.1f}  {ms[k] / ms['folded']:>9.2f}  {e}", flush=True)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--workloads", default="var128,var512")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    header(command_line())
    with tempfile.TemporaryDirectory() as d:
        ours, theirs, folded = build(args.layers, d)
        print(f"# {args.layers} of jina-embeddings-v3's 24 layers; five tasks, rank 4")
        print("workload   real_tokens  way          ms      vs_folded  max_abs_err")
        for name in args.workloads.split(","):
            measure(name, ours, theirs, folded, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
