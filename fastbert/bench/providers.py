"""What the encoder benchmark times: fastbert, transformers (sdpa / eager; bf16 cast or autocast),
the peers (fastbert.bench.peers), the GEMM floor on each GEMM path, fastbert's ablation variants, and
MiniLM under SentenceEncoder vs sentence-transformers."""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, Optional, Tuple

import torch

import fastbert
import fastbert.hf
from fastbert.bench.peers import peer_providers
from fastbert.bench.workloads import random_transformers_bert
from fastbert.dtypes import dtype_name
from fastbert.ops import gemm

MEASURED = "per-shape"  # the floor variant on fastbert's measured choice of path for each shape


def _linears(layer):
    """(weight, bias) of a layer's four products as the model runs them: QKV joined, attention
    output, FFN1, FFN2."""
    sa = layer.attention.self
    return [(torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]), torch.cat([sa.query.bias, sa.key.bias,
                                                                                      sa.value.bias])),
            (layer.attention.output.dense.weight, layer.attention.output.dense.bias),
            (layer.intermediate.dense.weight, layer.intermediate.dense.bias),
            (layer.output.dense.weight, layer.output.dense.bias)]


def gemm_floor(model, tokens: int, dtype, path: Optional[str] = None, layers: Optional[int] = None,
               qkv_only: bool = False):
    """A callable running exactly the model's linear layers (the first `layers`; only the QKV
    product with qkv_only) on `tokens` rows, in `dtype`, every product on GEMM path `path` (None:
    fastbert's measured choice for each shape). dtype torch.int8: the products of int8 inference,
    int8 rows by int8 weights (per channel) into the accumulator."""
    cfg = model.config
    if dtype == torch.int8:
        g = torch.Generator().manual_seed(0)

        def rows(n):
            return torch.randint(-127, 128, (tokens, n), generator=g, dtype=torch.int8)

        def operands(w, b):
            return fastbert.ops.quantize_weight(w, gemm.int8_weight_range())[0], None

        def product(x, w, b):
            fastbert.ops.int8_matmul(x, w)
    else:
        def rows(n):
            return torch.randn(tokens, n).to(dtype)

        def operands(w, b):
            return w.to(dtype), b.to(dtype)

        product = fastbert.ops.linear
    weights = [[operands(w, b) for w, b in _linears(layer)[:1 if qkv_only else 4]]
               for layer in model.encoder.layer[:layers]]
    x, inter = rows(cfg.hidden_size), rows(cfg.intermediate_size)
    inputs = (x, x, x, inter)

    def run():
        # the linear layers as fastbert's model runs them for inference (outputs into reused
        # buffers, not freshly page-faulted ones), so that the floor is the fastest way to run them
        with gemm.forced(path) if path is not None else contextlib.nullcontext():
            for layer in weights:
                for a, (w, b) in zip(inputs, layer):
                    product(a, w, b)

    return run


SLOW_PATH = 4.0  # a path this many times slower than the fastest on one product gets no floor row


def _slow_paths(model, tokens: int, dtype, paths) -> Dict[str, float]:
    """{path: its time over the fastest's} for the paths SLOW_PATH times slower than the fastest on the
    model's QKV product (at most 256 rows): a floor on them would take minutes and say nothing (torch's
    _int_mm is a scalar loop on CPUs without VNNI)."""
    if len(paths) < 2:
        return {}
    one = {p: gemm_floor(model, min(tokens, 256), dtype, p, layers=1, qkv_only=True) for p in paths}
    best = {p: min(_seconds(run) for _ in range(3)) for p, run in one.items()}
    fastest = min(best.values())
    return {p: t / fastest for p, t in best.items() if t > SLOW_PATH * fastest}


def _seconds(run: Callable) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def floor_providers(model, tokens: int, dtype) -> Dict[str, Callable]:
    """"GEMM floor <dtype> <path>" for every GEMM path this machine offers (but those SLOW_PATH times
    slower than the fastest, said on stdout), and on the per-shape choice (dtype torch.int8: the int8
    products of int8 inference)."""
    tag = dtype_name(dtype)
    paths = gemm.candidates("fwd", dtype)
    slow = _slow_paths(model, tokens, dtype, paths)
    for p, ratio in slow.items():
        print(f"floor skipped: GEMM floor {tag} {p}: {ratio:.1f}x the fastest path on the QKV product")
    provs = {f"GEMM floor {tag} {p}": gemm_floor(model, tokens, dtype, p) for p in paths if p not in slow}
    provs[f"GEMM floor {tag} {MEASURED}"] = gemm_floor(model, tokens, dtype)
    return provs


def encoder_providers(layers: int, dtypes, ids, mask, peers=()) -> Tuple[Dict[str, Callable], Callable, Dict]:
    """(providers, reference, skipped peers): every provider on the same weights and batch; the
    reference gives transformers' fp32 (sdpa) last hidden state, to measure each one's error."""
    hf = {impl: random_transformers_bert(layers, impl) for impl in ("sdpa", "eager")}
    fb = fastbert.hf.from_transformers(hf["sdpa"]).eval()
    tokens = int(mask.sum())
    provs: Dict[str, Callable] = {}
    for dtype in dtypes:
        tag = dtype_name(dtype)
        fm = fb if dtype == torch.float32 else _copy_to(fb, dtype)
        provs[f"fastbert {tag}"] = (lambda m=fm: m(ids, mask))
        provs.update(floor_providers(fb, tokens, dtype))
        if dtype == torch.int8:  # no transformers int8: its rows are fastbert's, the peers' and the floor
            continue
        for impl, hm in hf.items():
            if dtype == torch.float32:
                provs[f"transformers {impl} {tag}"] = (lambda m=hm: m(input_ids=ids, attention_mask=mask))
            else:
                cast = _copy_to(hm, dtype)
                provs[f"transformers {impl} {tag} cast"] = (lambda m=cast: m(input_ids=ids, attention_mask=mask))
                if impl == "sdpa":
                    def autocast(m=hm, dt=dtype):
                        with torch.autocast("cpu", dtype=dt):
                            return m(input_ids=ids, attention_mask=mask)

                    provs[f"transformers {impl} {tag} autocast"] = autocast
    peer_provs, skipped = peer_providers(hf["sdpa"], ids, mask, dtypes, peers) if peers else ({}, {})
    provs.update(peer_provs)
    return provs, (lambda: hf["sdpa"](input_ids=ids, attention_mask=mask).last_hidden_state), skipped


def last_hidden(out) -> torch.Tensor:
    """The [batch, seq, hidden] tensor of a provider's result (a model output or the tensor)."""
    return out if isinstance(out, torch.Tensor) else out.last_hidden_state


def _copy_to(model, dtype):
    """A copy of `model` in `dtype` (torch.int8: quantized for int8 inference)."""
    import copy

    if dtype == torch.int8:
        return copy.deepcopy(model).quantize_("int8")
    return copy.deepcopy(model).to(dtype)


def ablation_providers(layers: int, dtype, ids, mask) -> Dict[str, object]:
    """fastbert with one of its CPU choices undone at a time, on the same weights and inputs:
    the padded path instead of the packed one, torch's ops instead of the fused C++ ones, one
    thread instead of all; and the GEMM floor."""
    model = fastbert.hf.from_transformers(random_transformers_bert(layers)).eval()
    if dtype != torch.float32:
        model = model.to(dtype)
    threads = torch.get_num_threads()

    def variant(backend=None, unpad=True, n_threads=threads):
        def call():
            model.set_backend(backend)
            model.unpad_inputs = unpad
            torch.set_num_threads(n_threads)
            try:
                return model(ids, mask)
            finally:
                torch.set_num_threads(threads)

        return call

    tag = dtype_name(dtype)
    provs = {
        f"fastbert {tag}": variant(),
        f"padded path {tag}": variant(unpad=False),
        f"torch ops {tag}": variant(backend="torch"),
        f"torch ops, padded path {tag}": variant(backend="torch", unpad=False),
    }
    if threads > 1:
        provs[f"fastbert, 1 thread {tag}"] = variant(n_threads=1)
    provs.update(floor_providers(model, int(mask.sum()), dtype))
    return provs


def minilm_providers(path: str, sentences, batch_size: int, quantize: Optional[str] = None):
    """(providers, encoder): SentenceEncoder and sentence-transformers' encode on the same sentences
    (and SentenceEncoder(quantize=...) when asked)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(path, device="cpu")
    enc = fastbert.SentenceEncoder(path)
    provs = {
        "fastbert SentenceEncoder": lambda: enc.encode(sentences, batch_size=batch_size),
        "sentence-transformers": lambda: st.encode(sentences, batch_size=batch_size),
    }
    if quantize:
        qenc = fastbert.SentenceEncoder(path, quantize=quantize)
        provs[f"fastbert SentenceEncoder {quantize}"] = lambda: qenc.encode(sentences, batch_size=batch_size)
    return provs, enc
