"""BGE-M3's three outputs from one forward against its dense output alone: SentenceEncoder.encode
with output="all" (dense, sparse lexical weights, ColBERT multi-vectors; fastbert.token_outputs)
and with output="dense", on the same sentences, in the same run. The model: a BGE-M3-shaped
directory written here (XLM-R at --size's configuration with random weights, CLS pooling,
Normalize, sparse_linear.pt and colbert_linear.pt), a word-level tokenizer over random words; the
sentences: --sentences of 16..128 words. Each output's time is the fastest of --rounds rounds taken
in turn; the ratio all / dense is the cost of the two heads and of their per-text results.

    python benchmarks/bench_token_outputs.py [--size base|large] [--sentences 64] [--rounds 5] [--json PATH]
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
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    import fastbert

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(16, 129, (args.sentences,), generator=g).tolist()
    sentences = [" ".join(f"w{int(i)}" for i in torch.randint(0, WORDS, (n,), generator=g)) for n in lengths]
    with tempfile.TemporaryDirectory() as path:
        write_directory(path, args.size)
        enc = fastbert.SentenceEncoder(path)
        best = {"dense": float("inf"), "all": float("inf")}
        for output in best:  # one untimed call each
            enc.encode(sentences, batch_size=args.batch_size, output=output)
        for _ in range(args.rounds):
            for output in best:
                t0 = time.perf_counter()
                enc.encode(sentences, batch_size=args.batch_size, output=output)
                best[output] = min(best[output], time.perf_counter() - t0)
    tokens = sum(lengths) + 2 * len(lengths)
    rows = [{"output": o, "seconds": s, "tokens_per_s": tokens / s, "over_dense": s / best["dense"]}
            for o, s in best.items()]

    def show(rows):
        print(f"# {args.size}: {args.sentences} sentences of 16..128 words ({tokens} tokens), batch {args.batch_size}")
        print(f"{'output':<8}{'seconds':>10}{'tokens/s':>11}{'/ dense':>9}")
        for r in rows:
            print(f"{r['output']:<8}{r['seconds']:>10.3f}{r['tokens_per_s']:>11.0f}{r['over_dense']:>9.3f}")

    finish(rows, show, argv, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
