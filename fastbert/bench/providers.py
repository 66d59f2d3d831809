"""What the encoder benchmark times: fastbert, transformers (sdpa / eager; bf16 cast or autocast),
the peers (fastbert.bench.peers), the GEMM floor on each GEMM path, fastbert's ablation variants, and
MiniLM under SentenceEncoder vs sentence-transformers."""
from __future__ import annotations

import contextlib
import copy
from typing import Callable, Dict, Optional, Tuple

import torch

import fastbert
import fastbert.hf
from fastbert.bench.peers import peer_providers
from fastbert.bench.workloads import random_transformers_encoder
from fastbert.dtypes import dtype_name
from fastbert.ops import gemm

MEASURED = "per-shape"  # the floor variant on fastbert's measured choice of path for each shape
PACKED = "packed"  # the int8 floor on weights stored packed


def _linears(layer):
    """(weight, bias) of a layer's four products as the model runs them: QKV joined, attention
    output, FFN1, FFN2."""
    sa = layer.self_attention
    return [(torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]), torch.cat([sa.query.bias, sa.key.bias,
                                                                                      sa.value.bias])),
            (layer.attention_output.weight, layer.attention_output.bias),
            (layer.ffn_input.weight, layer.ffn_input.bias), (layer.ffn_output.weight, layer.ffn_output.bias)]


def gemm_floor(model, tokens: int, dtype, path: Optional[str] = None):
    """A callable running exactly the model's linear layers on `tokens` rows, in `dtype`, every
    product on GEMM path `path` (None: fastbert's measured choice for each shape). dtype torch.int8:
    the products of int8 inference, int8 rows by int8 weights (per channel) into the accumulator;
    path "packed": on weights stored packed (None: packed where int8 layers store them so here)."""
    cfg = model.config
    if dtype == torch.int8:
        g = torch.Generator().manual_seed(0)
        layout = PACKED if path == PACKED else None  # packed: every weight that can be, whatever was measured
        path = None if path == PACKED else path

        def rows(n):
            return torch.randint(-127, 128, (tokens, n), generator=g, dtype=torch.int8)

        def operands(w, b):
            q = fastbert.ops.quantize_weight(w)[0]
            return (fastbert.ops.int8.stored_weight(q, layout) if path is None else q), None

        def product(x, w, b):
            fastbert.ops.int8_matmul(x, w)
    else:
        def rows(n):
            return torch.randn(tokens, n).to(dtype)

        def operands(w, b):
            return w.to(dtype), b.to(dtype)

        product = fastbert.ops.linear
    layers = [[operands(w, b) for w, b in _linears(layer)] for layer in model.layers]
    x, inter = rows(cfg.hidden_size), rows(cfg.intermediate_size)

    def run():
        # the linear layers as fastbert's model runs them for inference (outputs into reused
        # buffers, not freshly page-faulted ones), so that the floor is the fastest way to run them
        with gemm.forced(path) if path is not None else contextlib.nullcontext():
            for (wq, bq), (wo, bo), (wi, bi), (w2, b2) in layers:
                product(x, wq, bq)
                product(x, wo, bo)
                product(x, wi, bi)
                product(inter, w2, b2)

    return run


def floor_providers(model, tokens: int, dtype) -> Dict[str, Callable]:
    """"GEMM floor <dtype> <path>" for every GEMM path this machine offers, and on the per-shape
    choice (dtype torch.int8: the int8 products of int8 inference)."""
    tag = dtype_name(dtype)
    paths = gemm.candidates("fwd", dtype)
    if dtype == torch.int8 and fastbert.backend.cpp_function("int8_gemm_packed") is not None:
        paths.append(PACKED)  # the weights stored packed (fastbert.ops.int8.int8_layout)
    provs = {f"GEMM floor {tag} {p}": gemm_floor(model, tokens, dtype, p) for p in paths}
    provs[f"GEMM floor {tag} {MEASURED}"] = gemm_floor(model, tokens, dtype)
    return provs


def encoder_providers(layers: int, dtypes, ids, mask, peers=(), arch: str = "bert") -> Tuple[Dict[str, Callable],
                                                                                          Callable, Dict]:
    """(providers, reference, skipped peers): every provider on the same weights and batch of the
    `arch` model (fastbert.bench.workloads.ARCHS); the reference gives transformers' fp32 (sdpa) last
    hidden state, to measure each one's error."""
    hf = {impl: random_transformers_encoder(layers, impl, arch) for impl in ("sdpa", "eager")}
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
    if dtype == torch.int8:
        return copy.deepcopy(model).quantize_("int8")
    return copy.deepcopy(model).to(dtype)


def ablation_providers(layers: int, dtype, ids, mask) -> Dict[str, object]:
    """fastbert with one of its CPU choices undone at a time, on the same weights and inputs:
    the padded path instead of the packed one, torch's ops instead of the fused C++ ones, one
    thread instead of all; and the GEMM floor."""
    model = fastbert.hf.from_transformers(random_transformers_encoder(layers)).eval()
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
