"""The encoder benchmark's workloads: BERT-base-shaped random batches, the transformers model they
run on (same random weights every call), and real sentences for the MiniLM workload."""
from __future__ import annotations

import torch

WORKLOADS = {
    "var128": dict(batch=32, lo=16, hi=128),
    "full128": dict(batch=32, lo=128, hi=128),
    "var512": dict(batch=8, lo=64, hi=512),
}


def base_config(layers: int, **kw):
    return dict(vocab_size=30522, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                intermediate_size=3072, max_position_embeddings=512, **kw)


def make_batch(batch, lo, hi, g, vocab=30522):
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g)
    seq = int(lengths.max())
    ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def random_transformers_bert(layers: int, impl: str = "sdpa"):
    """transformers' BertModel with BERT-base shapes and the same random weights on every call."""
    import transformers

    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(**base_config(layers), attn_implementation=impl)).eval()


def real_sentences(n):
    """Real English text found on every machine with Python: the standard library's docstrings."""
    import importlib
    import inspect
    import pkgutil

    out = []
    for info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if len(out) >= n * 3 or info.name.startswith("_") or "test" in info.name:
            continue
        if info.name not in ("json", "email", "argparse", "collections", "pathlib", "inspect", "shutil", "logging",
                             "unittest", "http", "urllib", "csv", "datetime", "decimal", "fractions", "statistics",
                             "textwrap", "string", "random", "heapq", "bisect", "functools", "itertools", "tarfile",
                             "zipfile", "subprocess", "threading", "asyncio", "socket", "ssl", "sqlite3", "xml"):
            continue
        try:
            mod = importlib.import_module(info.name)
        except Exception:
            continue
        for _, obj in inspect.getmembers(mod):
            for para in (inspect.getdoc(obj) or "").split("\n\n"):
                text = " ".join(para.split())
                if 10 <= len(text) <= 1500:
                    out.append(text)
    out = list(dict.fromkeys(out))
    if len(out) < n:
        raise RuntimeError(f"found only {len(out)} sentences of documentation text, {n} asked")
    return out[:n]
