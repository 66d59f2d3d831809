"""Korean retrieval with an XLM-RoBERTa-shaped sentence encoder, offline, in about a minute on 2 CPU cores.

The multilingual embedding models Korean users deploy (multilingual-e5, bge-m3, KURE, KoE5) are
XLM-RoBERTa encoders with mean pooling, a normalised output and e5's prompts. This example builds one
of that shape from nothing, on text it writes itself (Korean sentences about who ate what, where):

1. trains an XLM-R-style Unigram tokenizer (the `tokenizers` library) on the text;
2. trains a small fastbert.XLMRobertaModel as a sentence encoder: mean pooling over the real
   tokens, questions prefixed "query: " and passages "passage: ", in-batch negatives (each
   question's own passage against every other passage of its batch);
3. saves it as a sentence-transformers directory (modules.json, pooling, Normalize, the prompts),
   loads that with fastbert.SentenceEncoder (and with quantize="int8"), and prints the share of
   held-out questions whose own passage ranks first among all passages, before and after training.

    python examples/korean_retrieval.py [--out korean-retrieval-out] [--steps 300]
"""
import argparse
import json
import os
import random
import time

import torch

import fastbert

PEOPLE = ["민지", "지호", "서연", "도윤", "하은", "준우", "수아", "현우", "예린", "태민"]
CITIES = ["서울", "부산", "대구", "광주", "대전", "제주", "강릉", "전주", "춘천", "여수"]
FOODS = ["국수", "비빔밥", "김치찌개", "떡볶이", "냉면", "불고기", "해물파전", "순두부"]
PROMPTS = {"query": "query: ", "passage": "passage: "}


def josa(word: str, with_final: str, without: str) -> str:
    """word + the particle form its last syllable takes (은/는, 을/를: by its final consonant)."""
    return word + (with_final if (ord(word[-1]) - 0xAC00) % 28 else without)


def pairs(seed: int):
    """(question, passage) for every person and city: the passage says what the person ate there."""
    rng = random.Random(seed)
    out = []
    for p in PEOPLE:
        for c in CITIES:
            food = rng.choice(FOODS)
            who = josa(p, "은", "는")
            passage = f"{who} 지난 여름 {c}에서 {josa(food, '을', '를')} 먹었다."
            question = rng.choice([f"{p}{'이' if (ord(p[-1]) - 0xAC00) % 28 else '가'} {c}에서 먹은 음식은?",
                                   f"{c}에서 {who} 무엇을 먹었나?"])
            out.append((question, passage))
    rng.shuffle(out)
    return out


def tokenizer_for(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[(t, tok.token_to_id(t)) for t in ("<s>", "</s>")])
    return tok


def save_sentence_encoder(model, tok, out: str) -> None:
    """model + tokenizer as sentence-transformers writes an e5-style encoder."""
    model.save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    files = {
        "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                         {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
        "sentence_bert_config.json": {"max_seq_length": 64, "do_lower_case": False},
        "config_sentence_transformers.json": {"prompts": PROMPTS, "default_prompt_name": None},
        "1_Pooling/config.json": {"embedding_dimension": model.config.hidden_size, "pooling_mode": "mean"},
        "2_Normalize/config.json": {},
    }
    for name, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(content, f, ensure_ascii=False, indent=2)


def top1(directory: str, test, quantize=None) -> float:
    """Share of questions whose own passage is the nearest of all the test passages."""
    enc = fastbert.SentenceEncoder(directory, quantize=quantize)
    q = torch.from_numpy(enc.encode([a for a, _ in test], prompt_name="query"))
    p = torch.from_numpy(enc.encode([b for _, b in test], prompt_name="passage"))
    return float(((q @ p.T).argmax(1) == torch.arange(len(test))).float().mean())


def train(model, tok, data, steps: int, batch: int = 32, lr: float = 2e-3) -> None:
    def embed(texts):
        enc = [e.ids for e in tok.encode_batch(texts)]
        n = max(map(len, enc))
        ids = torch.tensor([x + [1] * (n - len(x)) for x in enc])
        mask = (ids != 1).long()
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[..., None].to(h.dtype)
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30) * max(0.0, 1 - s / steps))
    rng = random.Random(0)
    model.train()
    for _ in range(steps):
        chunk = rng.sample(data, batch)
        q = embed([PROMPTS["query"] + a for a, _ in chunk])
        p = embed([PROMPTS["passage"] + b for _, b in chunk])
        loss = torch.nn.functional.cross_entropy(q @ p.T / 0.05, torch.arange(batch))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="korean-retrieval-out")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    data = pairs(seed=0)
    train_pairs, test = data[:70], data[70:]
    tok = tokenizer_for([PROMPTS["query"] + a for a, _ in data] + [PROMPTS["passage"] + b for _, b in data])
    torch.manual_seed(0)
    config = fastbert.XLMRobertaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=256, max_position_embeddings=514,
                                       type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                       layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = fastbert.XLMRobertaModel(config, add_pooling_layer=False)
    save_sentence_encoder(model, tok, os.path.join(args.out, "untrained"))
    before = top1(os.path.join(args.out, "untrained"), test)
    start = time.time()
    train(model, tok, train_pairs, args.steps)
    save_sentence_encoder(model, tok, os.path.join(args.out, "encoder"))
    after = top1(os.path.join(args.out, "encoder"), test)
    after_int8 = top1(os.path.join(args.out, "encoder"), test, quantize="int8")
    print(f"held-out questions whose own passage ranks first of {len(test)}: {before:.1%} untrained -> "
          f"{after:.1%} trained ({time.time() - start:.0f} s), {after_int8:.1%} with quantize='int8'")
    question, passage = test[0]
    print(f"e.g. {question!r} -> {passage!r}")
    return after


if __name__ == "__main__":
    main()
