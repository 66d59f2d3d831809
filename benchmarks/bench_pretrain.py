"""Benchmark pretraining steps: fastbert's BertForPreTraining against transformers' on the same batches.

One training step = forward with MLM labels and next-sentence labels, backward, gradient clipping,
AdamW step. Both models start from the same weights (BERT-small shapes by default: 4 layers,
hidden 512, 8 heads, intermediate 2048, vocabulary 30522) and see the same batches: sequence
length 128, lengths varying from pair to pair (--lengths), 15% of the real tokens masked by
fastbert.masking. Providers:

  transformers             transformers.BertForPreTraining(**batch).loss (attn_implementation sdpa)
  fastbert                 fastbert.BertForPreTraining(**batch).loss: the same call on the fused ops
                           (logits of every position, as transformers computes them)
  fastbert trainer step    the step `fastbert pretrain` takes: the same model and loss, with the MLM
                           head run on the masked tokens only (fastbert.pretraining.objective.PretrainingObjective)

fp32, and bf16 under torch.autocast (both models). The providers are called in turn, round after
round (fastbert.bench.timing), and every ratio is of medians measured in this run.

    python benchmarks/bench_pretrain.py [--dtypes fp32,bf16] [--batch-size 16] [--json PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

# OpenMP threads that wait by spinning burn the core a descheduled partner needs when the machine is
# shared, so the step waits longer for that partner; sleeping waits cost both contenders the same.
# This must be set before torch loads the OpenMP runtime. An OMP_WAIT_POLICY already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import fastbert  # noqa: E402
from fastbert.bench.report import command_line, header, without_slow_bf16, write_json  # noqa: E402
from fastbert.bench.timing import interleaved_cpu_times  # noqa: E402
from fastbert.masking import IGNORE_INDEX, mask_tokens  # noqa: E402
from fastbert.pretraining.config import PRECISIONS as DTYPES  # noqa: E402
from fastbert.pretraining.objective import PretrainingObjective, cast_embeddings_under_autocast  # noqa: E402
from fastbert.pretraining.schedule import param_groups  # noqa: E402

PAD, CLS, SEP, MASK = 0, 101, 102, 103  # BERT's ids


def draw_lengths(batch: int, seq: int, kind: str, g: torch.Generator) -> torch.Tensor:
    if kind == "full":
        return torch.full((batch,), seq, dtype=torch.int64)
    if kind == "pretraining":  # create_pretraining_data: 90% fill the target, 10% a shorter one
        short = torch.rand(batch, generator=g) < 0.1
        lens = torch.full((batch,), seq, dtype=torch.int64)
        lens[short] = torch.randint(8, seq + 1, (int(short.sum()),), generator=g)
        return lens
    return torch.randint(16, seq + 1, (batch,), generator=g)  # uniform


def make_batches(n: int, batch: int, seq: int, vocab: int, kind: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        lens = draw_lengths(batch, seq, kind, g)
        real = torch.arange(seq)[None, :] < lens[:, None]
        ids = torch.randint(1000, vocab, (batch, seq), generator=g)
        types = torch.zeros(batch, seq, dtype=torch.int64)
        for b, n_b in enumerate(lens.tolist()):
            a = max(2, n_b // 2)
            ids[b, 0], ids[b, a - 1], ids[b, n_b - 1] = CLS, SEP, SEP
            types[b, a:n_b] = 1
        ids[~real] = PAD
        special = (ids == CLS) | (ids == SEP)
        masked, labels = mask_tokens(ids, mask_token_id=MASK, vocab_size=vocab, special_tokens_mask=special,
                                     attention_mask=real, seed=seed * 1000 + i)
        out.append({"input_ids": masked, "attention_mask": real.long(), "token_type_ids": types, "labels": labels,
                    "next_sentence_label": torch.randint(0, 2, (batch,), generator=g)})
    return out


def build(args, device):
    import transformers

    cfg = fastbert.BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                              num_attention_heads=args.heads, intermediate_size=args.intermediate,
                              max_position_embeddings=512)
    torch.manual_seed(0)
    ours = fastbert.BertForPreTraining(cfg).to(device).train()
    hf_cfg = transformers.BertConfig(**{k: v for k, v in cfg.to_dict().items() if k not in ("architectures", "dtype")})
    hf_cfg._attn_implementation = args.attn
    theirs = transformers.BertForPreTraining(hf_cfg)
    theirs.load_state_dict(ours.state_dict(), strict=False)
    theirs.tie_weights()
    theirs.to(device).train()
    return ours, theirs


def step_fn(loss_fn, model, batches, device, amp_dtype):
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, foreach=True)
    params = [p for p in model.parameters() if p.requires_grad]
    state = {"i": 0}
    dev_batches = [{k: v.to(device) for k, v in b.items()} for b in batches]

    def run():
        batch = dev_batches[state["i"] % len(dev_batches)]
        state["i"] += 1
        if amp_dtype is None:
            loss = loss_fn(batch)
        else:
            with torch.autocast(device_type=device.type, dtype=amp_dtype):
                loss = loss_fn(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return loss

    return run


def measure(args, dname: str, batches, device, real: float) -> list:
    """The three providers' training steps in one dtype, timed in turn; their loss on batch 0 first."""
    amp = DTYPES[dname]
    ours, theirs = build(args, device)
    if amp is not None:
        cast_embeddings_under_autocast(ours, device.type)
    ours_trainer = fastbert.BertForPreTraining(ours.config).to(device).train()
    ours_trainer.load_state_dict(ours.state_dict())
    if amp is not None:
        cast_embeddings_under_autocast(ours_trainer, device.type)
    objective = PretrainingObjective(ours_trainer)
    fns = {
        "transformers": step_fn(lambda b: theirs(**b).loss, theirs, batches, device, amp),
        "fastbert": step_fn(lambda b: ours(**b).loss, ours, batches, device, amp),
        "fastbert trainer step": step_fn(lambda b: objective(**b)[0], ours_trainer, batches, device, amp),
    }
    # the same loss from the same weights on the same batch (dropout off for this check)
    b0 = {k: v.to(device) for k, v in batches[0].items()}
    losses = {"transformers": lambda: theirs(**b0).loss, "fastbert": lambda: ours(**b0).loss,
              "fastbert trainer step": lambda: objective(**b0)[0]}
    for model in (theirs, ours, ours_trainer):
        model.eval()
    with torch.no_grad(), (torch.autocast(device_type=device.type, dtype=amp) if amp else contextlib.nullcontext()):
        first = {name: float(fn()) for name, fn in losses.items()}
    for model in (theirs, ours, ours_trainer):
        model.train()
    t0 = time.perf_counter()
    times = interleaved_cpu_times(fns, warmup=args.warmup, repeats=args.rounds, budget_s=args.budget)
    elapsed = time.perf_counter() - t0
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"# {dname}: {len(times['transformers'])} rounds in {elapsed:.0f} s; loss on batch 0 before training "
          + ", ".join(f"{k} {v:.4f}" for k, v in first.items()))
    return [{
        "dtype": dname, "provider": name, "median_s": med[name], "steps_per_s": 1.0 / med[name],
        "real_tokens_per_s": real / med[name], "speedup": med["transformers"] / med[name],
        "rounds": len(times[name]), "first_loss": first[name], "min_s": min(times[name]), "max_s": max(times[name]),
    } for name in fns]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16, fp16 (default %(default)s)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lengths", choices=("uniform", "pretraining", "full"), default="uniform",
                    help="pair lengths: uniform in 16..seq (default), pretraining (90%% full, 10%% shorter), full")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--attn", default="sdpa", help="transformers' attn_implementation (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of timing per dtype (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget", type=float, default=150.0, help="seconds of timing per dtype at most")
    ap.add_argument("--batches", type=int, default=4, help="distinct batches, used in turn")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d!r}; choose from {sorted(DTYPES)}")
    if device.type == "cpu":
        dtypes = without_slow_bf16(dtypes)

    command = command_line(argv, "bench_pretrain")
    info = header(command, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"))
    batches = make_batches(args.batches, args.batch_size, args.seq, args.vocab, args.lengths)
    real = statistics.mean(int(b["attention_mask"].sum()) for b in batches)
    masked = statistics.mean(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
    print(f"# BertForPreTraining {args.layers} layers, hidden {args.hidden}, {args.heads} heads, intermediate "
          f"{args.intermediate}, vocab {args.vocab}; batch {args.batch_size} x seq {args.seq}, lengths {args.lengths}: "
          f"{real:.0f} real tokens of {args.batch_size * args.seq} per batch, {masked:.0f} masked")

    rows = []
    for dname in dtypes:
        rows += measure(args, dname, batches, device, real)

    print()
    print("| dtype | provider | median s/step | steps/s | real tokens/s | vs transformers |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['dtype']} | {r['provider']} | {r['median_s']:.3f} | {r['steps_per_s']:.2f} | "
              f"{r['real_tokens_per_s']:.0f} | {r['speedup']:.2f}x |")
    if args.json:
        write_json(args.json, command, info, rows, args=vars(args), real_tokens_per_batch=real,
                   masked_tokens_per_batch=masked)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
