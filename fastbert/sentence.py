"""Sentence embeddings from a sentence-transformers directory, on fastbert's BERT.

    enc = fastbert.SentenceEncoder("path/to/all-MiniLM-L6-v2")
    emb = enc.encode(["a sentence", "another one"], batch_size=64)   # numpy [n, dim]

Reads modules.json (a BERT Transformer module, then Pooling, optionally Normalize),
sentence_bert_config.json (max_seq_length, do_lower_case), 1_Pooling/config.json and the fast
tokenizer (tokenizer.json), and gives the embeddings sentence-transformers gives. quantize="int8"
runs the encoder's linear layers in int8 (fastbert.model.int8; its accuracy against fp32 on MiniLM:
benchmarks/RESULTS.md). Sentences are
batched longest first, so each batch pads little, and returned in the order given.

    fastbert encode MODEL_DIR --input sentences.txt --output embeddings.npy [--quantize int8]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence

import numpy as np
import torch

from fastbert.model import BertModel

_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")


def _read_json(path: str, what: str):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"fastbert.SentenceEncoder: {what} not found at {path}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class SentenceEncoder:
    def __init__(self, path: str, *, backend: Optional[str] = None, dtype: Optional[torch.dtype] = None,
                 device=None, max_seq_length: Optional[int] = None, quantize: Optional[str] = None):
        if not os.path.isdir(path):
            raise FileNotFoundError(f"fastbert.SentenceEncoder: {path} is not a directory")
        modules = _read_json(os.path.join(path, "modules.json"), "modules.json")
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        if not kinds or kinds[0] != "Transformer" or "Pooling" not in kinds:
            raise ValueError(f"fastbert.SentenceEncoder: {path}: expected a Transformer module then Pooling, got {kinds}")
        unsupported = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
        if unsupported:
            raise ValueError(f"fastbert.SentenceEncoder: {path}: modules {unsupported} are not supported")
        root = os.path.join(path, modules[0].get("path", ""))
        pooling_dir = os.path.join(path, modules[kinds.index("Pooling")]["path"])
        st_config = {}
        if os.path.isfile(os.path.join(root, "sentence_bert_config.json")):
            st_config = _read_json(os.path.join(root, "sentence_bert_config.json"), "sentence_bert_config.json")
        pooling = _read_json(os.path.join(pooling_dir, "config.json"), "the pooling config")
        modes = [m for m in _POOLING_MODES if pooling.get(f"pooling_mode_{m}")]
        others = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v and k[13:] not in _POOLING_MODES]
        if not modes or others:
            raise ValueError(
                f"fastbert.SentenceEncoder: pooling {others or 'none'} is not supported; supported: {_POOLING_MODES}"
            )
        self.pooling_modes = modes
        self.normalize = "Normalize" in kinds
        self.do_lower_case = bool(st_config.get("do_lower_case", False))
        self.model = BertModel.from_pretrained(root, backend=backend, dtype=dtype, quantize=quantize)
        if device is not None:
            self.model.to(device)
        limit = self.model.config.max_position_embeddings
        self.max_seq_length = min(int(max_seq_length or st_config.get("max_seq_length") or limit), limit)
        from tokenizers import Tokenizer

        tok_file = os.path.join(root, "tokenizer.json")
        if not os.path.isfile(tok_file):
            raise FileNotFoundError(f"fastbert.SentenceEncoder: {root} has no tokenizer.json (a fast tokenizer is needed)")
        self.tokenizer = Tokenizer.from_file(tok_file)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size * len(self.pooling_modes)

    def tokenize(self, sentences: Sequence[str]) -> List[List[int]]:
        texts = [s.lower() if self.do_lower_case else s for s in sentences]
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def _embed(self, ids: List[List[int]]) -> torch.Tensor:
        device = self.model.device
        n = max(len(x) for x in ids)
        input_ids = torch.zeros(len(ids), n, dtype=torch.long)
        mask = torch.zeros(len(ids), n, dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        hidden = self.model(input_ids, mask).last_hidden_state.float()
        m = mask[..., None].to(hidden.dtype)
        parts = []
        for mode in self.pooling_modes:
            if mode == "cls_token":
                parts.append(hidden[:, 0])
            elif mode == "max_tokens":
                parts.append(hidden.masked_fill(m == 0, -1e9).max(dim=1).values)
            else:
                summed = (hidden * m).sum(dim=1)
                count = m.sum(dim=1).clamp(min=1e-9)
                parts.append(summed / (count if mode == "mean_tokens" else count.sqrt()))
        emb = torch.cat(parts, dim=-1)
        if self.normalize:
            emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        return emb

    @torch.no_grad()
    def encode(self, sentences, batch_size: int = 32, *, convert_to_numpy: bool = True, show_progress_bar: bool = False):
        """Embeddings [n, dim] (numpy float32, or a torch tensor), in the order of `sentences`."""
        single = isinstance(sentences, str)
        if single:
            sentences = [sentences]
        if not all(isinstance(s, str) for s in sentences):
            raise TypeError("fastbert.SentenceEncoder.encode: sentences must be strings")
        if batch_size < 1:
            raise ValueError(f"fastbert.SentenceEncoder.encode: batch_size must be >= 1, got {batch_size}")
        was_training = self.model.training
        self.model.eval()
        ids = self.tokenize(sentences)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = torch.empty(len(ids), self.dim)
        from tqdm import tqdm

        starts = range(0, len(order), batch_size)
        for s in tqdm(starts, desc="encode", unit="batch", disable=not show_progress_bar, file=sys.stderr):
            chunk = order[s : s + batch_size]
            out[chunk] = self._embed([ids[i] for i in chunk]).cpu()
        self.model.train(was_training)
        if single:
            out = out[0]
        return out.numpy() if convert_to_numpy else out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fastbert encode", description="Embed lines of text with a sentence-transformers model.")
    ap.add_argument("model", help="a sentence-transformers directory "
                    "(modules.json, config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--input", "-i", default="-", help="a text file, one sentence per line ('-': standard input)")
    ap.add_argument("--output", "-o", required=True, help="where to write the embeddings (.npy, float32 [lines, dim])")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--backend", default=None, choices=["triton", "cpp", "torch"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--quantize", default=None, choices=["int8"],
                    help="int8: int8 weights and activations in the encoder's linear layers (fastbert.model.int8)")
    args = ap.parse_args(argv)
    if args.input == "-":
        lines = [ln.rstrip("\n") for ln in sys.stdin]
    else:
        with open(args.input, encoding="utf-8") as f:
            lines = [ln.rstrip("\n") for ln in f]
    enc = SentenceEncoder(args.model, backend=args.backend, device=args.device, quantize=args.quantize)
    emb = enc.encode(lines, batch_size=args.batch_size, show_progress_bar=True) if lines else np.zeros((0, enc.dim), np.float32)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.output + ".tmp.npy"
    np.save(tmp, emb.astype(np.float32))
    os.replace(tmp, args.output)  # a complete file or none
    print(f"wrote {emb.shape[0]} x {emb.shape[1] if emb.ndim == 2 else 0} embeddings to {args.output}", file=sys.stderr)
    return 0
