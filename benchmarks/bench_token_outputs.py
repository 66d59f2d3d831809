"""BGE-M3's three outputs from one forward against its dense output alone: SentenceEncoder.encode
with output="all" (dense, sparse lexical weights, ColBERT multi-vectors; fastbert.token_outputs)
and with output="dense", on the same sentences, in the same run. The model: a BGE-M3-shaped
directory written here (XLM-R at --size's configuration with random weights, CLS pooling,
Normalize, sparse_linear.pt and colbert_linear.pt), a word-level tokenizer over random words; the
sentences: --sentences of 16..128 words. Each output's time is the fastest of --rounds rounds taken
in turn; the ratio all / dense is the cost of the two heads and of their per-text results.

With --quantize int8 the same encoder in int8 (fastbert.model.quantize; the heads stay fp32) is timed
too, and its outputs are held to fp32's: the dense embeddings' cosine, the share of each text's ten
heaviest sparse terms that int8 keeps among its ten, and BGE-M3's sparse and ColBERT scores of
consecutive sentence pairs (their largest difference, relative to fp32's score).

    python benchmarks/bench_token_outputs.py [--size base|large] [--sentences 64] [--rounds 5]
        [--quantize int8] [--json PATH]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch

from fastbert.bench.report import add_output_options, finish, parser

SIZES = {  # xlm-roberta-base's and BGE-M3's (xlm-roberta-large's) widths; a 4,000-word vocabulary
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}
WORDS = 4000


def write_directory(path: str, size: str) -> None:
    """A BGE-M3-shaped sentence-transformers directory in path (random weights)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"cls_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                   "model_max_length": 512}, f)
    torch.manual_seed(0)
    cfg = transformers.XLMRobertaConfig(vocab_size=len(vocab), max_position_embeddings=514, type_vocab_size=1,
                                        pad_token_id=1, bos_token_id=0, eos_token_id=2, **SIZES[size])
    transformers.XLMRobertaModel(cfg, add_pooling_layer=False).save_pretrained(path)
    hidden = cfg.hidden_size
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(path, "1_Pooling"))
    os.makedirs(os.path.join(path, "2_Normalize"))
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": hidden, "pooling_mode": "cls"}, f)
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), os.path.join(path, "sparse_linear.pt"))
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), os.path.join(path, "colbert_linear.pt"))


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quantize", choices=["int8"], default=None, help="also int8, timed and held to fp32")
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    import fastbert

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(16, 129, (args.sentences,), generator=g).tolist()
    sentences = [" ".join(f"w{int(i)}" for i in torch.randint(0, WORDS, (n,), generator=g)) for n in lengths]
    precisions = ["fp32"] + (["int8"] if args.quantize else [])
    with tempfile.TemporaryDirectory() as path:
        write_directory(path, args.size)
        encoders = {p: fastbert.SentenceEncoder(path, quantize="int8" if p == "int8" else None) for p in precisions}
        best = {(p, o): float("inf") for p in precisions for o in ("dense", "all")}
        outs = {p: encoders[p].encode(sentences, batch_size=args.batch_size, output="all") for p in precisions}
        for p, o in best:  # one untimed call each
            encoders[p].encode(sentences, batch_size=args.batch_size, output=o)
        for _ in range(args.rounds):
            for p, o in best:
                t0 = time.perf_counter()
                encoders[p].encode(sentences, batch_size=args.batch_size, output=o)
                best[p, o] = min(best[p, o], time.perf_counter() - t0)
    tokens = sum(lengths) + 2 * len(lengths)
    rows = [{"precision": p, "output": o, "seconds": s, "tokens_per_s": tokens / s,
             "over_dense": s / best[p, "dense"], "over_fp32": s / best["fp32", o]} for (p, o), s in best.items()]
    accuracy = int8_accuracy(outs["fp32"], outs["int8"]) if args.quantize else None

    def show(rows):
        print(f"# {args.size}: {args.sentences} sentences of 16..128 words ({tokens} tokens), batch {args.batch_size}")
        print(f"{'precision':<10}{'output':<8}{'seconds':>10}{'tokens/s':>11}{'/ dense':>9}{'/ fp32':>8}")
        for r in rows:
            print(f"{r['precision']:<10}{r['output']:<8}{r['seconds']:>10.3f}{r['tokens_per_s']:>11.0f}"
                  f"{r['over_dense']:>9.3f}{r['over_fp32']:>8.3f}")
        if accuracy is not None:
            print("# int8 against fp32: " + ", ".join(f"{k} {v:.4g}" for k, v in accuracy.items()))

    finish(rows, show, argv, json_path=args.json, int8_accuracy=accuracy)
    return 0


def int8_accuracy(fp32: dict, int8: dict, top: int = 10) -> dict:
    """int8's outputs held to fp32's (see the module docstring)."""
    import numpy as np

    from fastbert.token_outputs import colbert_score, sparse_score

    a, b = fp32["dense"], int8["dense"]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    kept = []
    for (ids_a, w_a), (ids_b, w_b) in zip(fp32["sparse"], int8["sparse"]):
        heaviest_a = set(ids_a[np.argsort(-w_a)[:top]].tolist())
        heaviest_b = set(ids_b[np.argsort(-w_b)[:top]].tolist())
        if heaviest_a:
            kept.append(len(heaviest_a & heaviest_b) / len(heaviest_a))

    def worst(score, name):  # the largest relative difference of int8's score of a consecutive pair from fp32's
        errors = []
        for i in range(len(a) - 1):
            want = score(fp32[name][i], fp32[name][i + 1])
            errors.append(abs(score(int8[name][i], int8[name][i + 1]) - want) / max(abs(want), 1e-12))
        return max(errors)

    sparse_err, colbert_err = worst(sparse_score, "sparse"), worst(colbert_score, "colbert")
    return {"dense cosine min": float(cos.min()), f"top-{top} sparse terms kept (mean)": float(np.mean(kept)),
            f"top-{top} sparse terms kept (min)": float(np.min(kept)),
            "sparse score rel. error (max)": float(sparse_err), "ColBERT score rel. error (max)": float(colbert_err)}


if __name__ == "__main__":
    sys.exit(main())
