"""The encoder benchmark's workloads: BERT-base-shaped random batches, the transformers model they
run on (same random weights every call), real sentences for the MiniLM workload, and the newer
encoders (ModernBERT, MPNet) on transformers and on fastbert."""
from __future__ import annotations

import torch

WORKLOADS = {
    "var128": dict(batch=32, lo=16, hi=128),
    "full128": dict(batch=32, lo=128, hi=128),
    "var512": dict(batch=8, lo=64, hi=512),
    "one20": dict(batch=1, lo=20, hi=20),  # a server's single short query at low load
}


def base_config(layers: int, **kw):
    return dict(vocab_size=30522, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                intermediate_size=3072, max_position_embeddings=512, **kw)


# the architectures the encoder benchmark runs: transformers' base model and config at base size
ARCHS = {
    "bert": ("BertModel", "BertConfig", {}),
    # xlm-roberta-base's configuration: a 250,002-token vocabulary, 514 positions from pad + 1, one token type
    "xlm-roberta": ("XLMRobertaModel", "XLMRobertaConfig",
                    dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                         bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)),
}


def make_batch(batch, lo, hi, g, vocab=30522, pad_id=0):
    """(input_ids, attention_mask) [batch, longest]: lengths uniform in lo..hi, random ids from 1000
    up, padding `pad_id`."""
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g)
    seq = int(lengths.max())
    ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return torch.where(mask.bool(), ids, torch.full_like(ids, pad_id)), mask


def arch_config(arch: str, layers: int, **kw):
    """transformers' config of `arch` (ARCHS) at base size with `layers` layers."""
    import transformers

    _, config, extra = ARCHS[arch]
    return getattr(transformers, config)(**{**base_config(layers), **extra}, **kw)


def random_transformers_encoder(layers: int, impl: str = "sdpa", arch: str = "bert"):
    """transformers' base model of `arch` at base size, the same random weights on every call."""
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, ARCHS[arch][0])(arch_config(arch, layers, attn_implementation=impl)).eval()


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


# the newer encoders the ModernBERT benchmarks run: transformers' class, its config and the base depth
MODERN_ARCHS = {"modernbert": ("ModernBertModel", "ModernBertConfig", 22), "mpnet": ("MPNetModel", "MPNetConfig", 12),
                "gte": ("GteModel", "GteConfig", 12), "nomic_bert": ("NomicBertModel", "NomicBertConfig", 12),
                "jina_embeddings_v3": ("JinaEmbeddingsV3Model", "JinaEmbeddingsV3Config", 24),
                "eurobert": ("EuroBertModel", "EuroBertConfig", 12),
                "deberta-v2": ("DebertaV2Model", "DebertaV2Config", 12)}
# where a family's base checkpoint is not transformers' default configuration: deberta-v3-base's (the
# default is deberta-v2-xlarge's)
ARCH_CONFIGS = {"deberta-v2": dict(vocab_size=128100, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                                   relative_attention=True, position_buckets=256, max_relative_positions=-1,
                                   pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                                   position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7)}


def modern_transformers(name: str, layers: int):
    """transformers' model of the family `name` at its base configuration with `layers` layers and
    random weights (seeded: the same in every process), with sdpa where it has it, eval, on the CPU."""
    import transformers

    cls, config_cls, _ = MODERN_ARCHS[name]
    config = getattr(transformers, config_cls)(**ARCH_CONFIGS.get(name, {}), num_hidden_layers=layers)
    torch.manual_seed(0)
    theirs = getattr(transformers, cls)(config).eval()
    if name not in ("mpnet", "deberta-v2"):  # MPNet's sdpa setting loses its relative bias; DeBERTa has no sdpa
        theirs.config._attn_implementation = "sdpa"
    return theirs


def modern_models(name: str, layers: int, backend: str, int8: bool = False):
    """(transformers' model (modern_transformers), fastbert's with the same weights on `backend`,
    quantized to int8 with int8), both eval, on the CPU."""
    import fastbert

    cls, config_cls, _ = MODERN_ARCHS[name]
    theirs = modern_transformers(name, layers)
    ours = getattr(fastbert, cls)(getattr(fastbert, config_cls)(**theirs.config.to_dict())).eval()
    ours.load_state_dict(theirs.state_dict())
    ours.set_backend(backend)
    if int8:
        ours.quantize_("int8")
    return theirs, ours
