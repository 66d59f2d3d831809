"""Korean end to end: prepare, pretrain, fine-tune a sentence-pair classifier, draw attention.

1. writes a Korean corpus (documents of related sentences, from templates: people, places, food,
   weather, travel) to OUT/corpus.txt, no downloads;
2. `fastbert pretrain` on it: a WordPiece vocabulary that keeps Hangul syllables (the default
   normaliser), MLM + NSP, a small BERT, 1000 steps (or --pretrain-minutes, if that comes first);
3. fine-tunes that checkpoint on Korean sentence pairs (natural language inference: the hypothesis
   follows from the premise, contradicts it, or is not settled by it; chance 33%) with BERT's
   recipe (AdamW, warm-up then linear decay), and prints held-out accuracy before and after;
4. draws the attention of the fine-tuned model on a Korean pair to OUT/attention_ko.png (Hangul
   labels in the NanumGothic font the plot extra brings).

    python examples/korean.py [--out korean-out] [--pretrain-minutes 2] [--steps 1500]
"""
import argparse
import os
import random
import time

import torch

import fastbert

PEOPLE = ["민지", "지호", "서연", "도윤", "하은", "준우", "수아", "현우"]
CITIES = ["서울", "부산", "대구", "광주", "대전", "제주", "강릉", "전주"]
FOODS = ["국수", "비빔밥", "김치찌개", "떡볶이", "냉면", "불고기", "해물파전", "순두부"]
ACTS = ["책을 읽었다", "산책을 했다", "친구를 만났다", "사진을 찍었다", "영화를 보았다", "시장을 구경했다"]
WEATHER = ["비가 조금 내렸다", "하늘이 맑았다", "바람이 세게 불었다", "눈이 왔다", "날씨가 따뜻했다"]
LABELS = ["함의", "중립", "모순"]  # entailment, neutral, contradiction


def josa(word: str, with_final: str, without: str) -> str:
    """word + the particle form its last syllable takes (은/는, 을/를: by its final consonant)."""
    return word + (with_final if (ord(word[-1]) - 0xAC00) % 28 else without)


def document(rng: random.Random) -> list:
    """4-6 sentences about one person's day in one city: consecutive sentences belong together."""
    p, city, food = rng.choice(PEOPLE), rng.choice(CITIES), rng.choice(FOODS)
    who = josa(p, "은", "는")
    pool = [f"{who} 아침 기차를 타고 {city}에 갔다.", f"그날 {city}에는 {rng.choice(WEATHER)}.",
            f"{who} 점심으로 {josa(food, '을', '를')} 먹었다.", f"오후에는 {city}에서 {rng.choice(ACTS)}.",
            f"{who} 저녁 늦게 집으로 돌아왔다.", f"다음에도 {city}에 다시 가고 싶다고 생각했다.",
            f"{who} 지난 여름에는 {rng.choice(CITIES)}에서 여름을 보낸 적이 {rng.choice(['있다', '없다'])}."]
    return pool[:rng.randint(4, 6)] + ([pool[6]] if rng.random() < 0.5 else [])


def write_corpus(path: str, documents: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(document(rng)) for _ in range(documents)) + "\n")


def make_pairs(n: int, seed: int):
    """(premise, hypothesis, label): the three labels in equal shares."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        who = josa(rng.choice(PEOPLE), "은", "는")
        city, other = rng.sample(CITIES, 2)
        premise = f"{who} 지난 여름 {city}에서 {josa(rng.choice(FOODS), '을', '를')} 먹었다."
        label = i % 3
        hypothesis = [f"{who} {city}에서 여름을 보낸 적이 있다.", f"{who} {other}에서 여름을 보낸 적이 있다.",
                      f"{who} {city}에서 여름을 보낸 적이 없다."][label]
        out.append((premise, hypothesis, label))
    rng.shuffle(out)
    return out


def accuracy(model, tokenizer, pairs) -> float:
    enc = tokenizer([a for a, _, _ in pairs], [b for _, b, _ in pairs], padding=True, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        pred = model(**enc).logits.argmax(-1)
    return float((pred == torch.tensor([label for _, _, label in pairs])).float().mean())


def finetune(model_dir: str, steps: int, lr: float, batch: int = 32) -> tuple:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = fastbert.BertForSequenceClassification.from_pretrained(model_dir, num_labels=3)
    train, held_out = make_pairs(3000, seed=1), make_pairs(300, seed=2)
    before = accuracy(model, tokenizer, held_out)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
    rng = random.Random(0)
    for step in range(steps):
        model.train()
        rows = rng.sample(train, batch)
        enc = tokenizer([a for a, _, _ in rows], [b for _, b, _ in rows], padding=True, return_tensors="pt")
        loss = model(**enc, labels=torch.tensor([label for _, _, label in rows])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % 50 == 0:
            print(f"fine-tune step {step + 1}/{steps}: loss {loss.item():.3f}", flush=True)
    return model, tokenizer, before, accuracy(model, tokenizer, held_out)


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="korean-out")
    ap.add_argument("--documents", type=int, default=3000, help="documents in the written corpus")
    ap.add_argument("--pretrain-minutes", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=1500, help="fine-tuning steps of 32 pairs")
    ap.add_argument("--lr", type=float, default=3e-4, help="fine-tuning peak learning rate (a small model takes more "
                                                             "than BERT-base's 2e-5..5e-5)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    corpus = os.path.join(args.out, "corpus.txt")
    write_corpus(corpus, args.documents)
    pretrained = os.path.join(args.out, "pretrained")
    from fastbert.commands.pretrain import main as pretrain

    pretrain(["--corpus", corpus, "--out", pretrained, "--overwrite", "--vocab-size", "2000", "--max-seq-length", "64",
              "--hidden-size", "128", "--num-layers", "2", "--num-heads", "2", "--intermediate-size", "512",
              "--batch-size", "32", "--max-steps", "1000", "--lr", "1e-3", "--eval-every", "0", "--save-every", "0",
              "--time-limit", str(args.pretrain_minutes), "--no-progress", "--log-every", "100"])
    model, tokenizer, before, after = finetune(pretrained, args.steps, args.lr)
    premise = make_pairs(1, seed=3)[0][0]
    probs = fastbert.attention_map(model, tokenizer, premise)
    enc = tokenizer(premise)
    png = os.path.join(args.out, "attention_ko.png")
    from fastbert.attention_maps import draw

    draw(probs, tokenizer.convert_ids_to_tokens(enc["input_ids"]), png, list(range(probs.shape[0])),
         list(range(probs.shape[1])))
    print(f"held-out accuracy (chance 33.3%): {100 * before:.1f}% -> {100 * after:.1f}%; attention map of "
          f"{premise!r}: {png}; {time.perf_counter() - t0:.0f} s in all")
    return after


if __name__ == "__main__":
    main()
