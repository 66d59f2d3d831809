"""What a served directory runs: a sentence-transformers directory gives embeddings, a sequence
classifier predictions, and one with a single label (a cross-encoder) reranking too.

Requests are tokenized here, in the request's own task (a text over the length limit is refused
unless the request asks to truncate it), and the model worker runs `Served.run` on batches of
rows from any number of requests.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

EMBED, RERANK, CLASSIFY = "embedding", "reranker", "classifier"


class InputError(ValueError):
    """A request the model cannot take as it is (answered 413, as text-embeddings-inference does)."""


@dataclass
class Row:
    """One sequence for the model: token ids, token types, the leading tokens the pooling skips, the
    task adapters it runs (a model with them: its request's prompt_name where that names a task)."""

    ids: List[int]
    type_ids: List[int]
    skip: int = 0
    task: Optional[str] = None

    def __len__(self) -> int:
        return len(self.ids)


def _kind(path: str) -> str:
    modules = os.path.join(path, "modules.json")
    if os.path.isfile(modules):  # sentence-transformers 6 writes one for cross-encoders too, with no Pooling
        with open(modules, encoding="utf-8") as f:
            if any(str(m.get("type", "")).endswith("Pooling") for m in json.load(f)):
                return EMBED
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{path} has neither modules.json (sentence-transformers) nor config.json")
    with open(config_file, encoding="utf-8") as f:
        config = json.load(f)
    architectures = config.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(f"{path} is neither a sentence-transformers directory (modules.json) nor a sequence "
                         f"classifier (its architectures: {architectures or 'none'}); nothing to serve")
    labels = config.get("id2label") or {}
    return RERANK if int(config.get("num_labels", len(labels) or 2)) == 1 else CLASSIFY


def warm_up_tokens(bucket: int) -> int:
    """The token count Served.warm_up runs in the power-of-two bucket (bucket / 2, bucket]: three
    quarters of it and one more (odd), or the bucket itself while it is under 8."""
    return bucket if bucket < 8 else bucket - bucket // 4 + 1


class Served:
    """The model of a directory and how requests reach it."""

    def __init__(self, path: str, *, quantize: Optional[str] = None, dtype=None, backend: Optional[str] = None,
                 task: Optional[str] = None):
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path} is not a directory")
        self.path = path
        self.kind = _kind(path)
        if self.kind == EMBED:
            from fastbert.sentence import SentenceEncoder

            self.encoder = SentenceEncoder(path, quantize=quantize, dtype=dtype, backend=backend, task=task)
            self.model, self.tokenizer = self.encoder.model, self.encoder.tokenizer
            self.max_input_length = self.encoder.max_seq_length
            self.outputs = self.encoder.outputs  # dense, tokens, BGE-M3's heads' outputs; SPLADE's sparse alone
        else:
            from fastbert.cross_encoder import CrossEncoder

            if task is not None:
                raise ValueError(f"task={task!r}: task adapters belong to embedding models")

            self.outputs = frozenset()  # what an embedding model gives (dense, tokens, sparse, colbert)
            self.cross = CrossEncoder(path, quantize=quantize, dtype=dtype, backend=backend)
            self.model, self.tokenizer = self.cross.model, self.cross.tokenizer
            self.max_input_length = self.cross.max_length
        self.model.eval()
        self.dtype = str(next(self.model.parameters()).dtype).replace("torch.", "")
        # as loaded: a directory saved from a quantized model is quantized again by its config.json
        self.quantize, self.quantization = self.model.quantized, self.model.quantization

    @property
    def labels(self) -> List[str]:
        config = self.model.config
        return [config.id2label.get(i, f"LABEL_{i}") for i in range(config.num_labels)]

    # ---- requests -> rows (in the request's task)

    def _rows(self, encodings, truncate: bool, skip: int = 0, task: Optional[str] = None) -> List[Row]:
        for i, e in enumerate(encodings):
            if e.overflowing and not truncate:
                raise InputError(f"input {i} is longer than the {self.max_input_length} tokens this model takes "
                                 "(send truncate: true to cut it)")
        return [Row(list(e.ids), list(e.type_ids), skip, task) for e in encodings]

    @property
    def prompts(self) -> List[str]:
        """The names of the model's prompts (prompt_name's values)."""
        return sorted(self.encoder.prompts) if self.kind == EMBED else []

    def _prompt(self, prompt_name: Optional[str]):
        """(prompt, tokens the pooling skips) of a prompt name; InputError for a name the model lacks."""
        try:
            return self.encoder.prompt(prompt_name)
        except ValueError as e:
            raise InputError(str(e).split(": ", 1)[-1]) from None

    def text_rows(self, texts: Sequence[str], truncate: bool, prompt_name: Optional[str] = None) -> List[Row]:
        """Rows of texts to embed (with the model's prompt), or of texts to classify."""
        if self.kind == EMBED:
            prompt, skip = self._prompt(prompt_name)
            try:
                task = self.encoder.task_for(prompt_name)
            except ValueError as e:
                raise InputError(str(e).split(": ", 1)[-1]) from None
            texts = [prompt + t for t in texts]
            if self.encoder.do_lower_case:
                texts = [t.lower() for t in texts]
            return self._rows(self.tokenizer.encode_batch(texts), truncate, skip, task)
        if prompt_name is not None:
            raise InputError("prompt_name applies to embedding models only")
        return self._rows(self.tokenizer.encode_batch(list(texts)), truncate)

    def pair_rows(self, pairs: Sequence[Sequence[str]], truncate: bool) -> List[Row]:
        return self._rows(self.tokenizer.encode_batch([tuple(p) for p in pairs]), truncate)

    def tokens(self, texts: Sequence[str], add_special_tokens: bool, prompt_name: Optional[str] = None) -> List[list]:
        """text-embeddings-inference's /tokenize answer: per text, its tokens with id, text,
        special, start and stop (character offsets into the text sent, prompt included)."""
        if prompt_name is not None:
            if self.kind != EMBED:
                raise InputError("prompt_name applies to embedding models only")
            prompt = self._prompt(prompt_name)[0]
            texts = [prompt + t for t in texts]
        out = []
        for text, e in zip(texts, self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)):
            out.append([{"id": i, "text": tok, "special": True, "start": None, "stop": None} if special else
                        {"id": i, "text": text[a:b], "special": False, "start": a, "stop": b}
                        for i, tok, special, (a, b) in zip(e.ids, e.tokens, e.special_tokens_mask, e.offsets)])
        return out

    # ---- rows -> outputs (in the model worker)

    @torch.inference_mode()
    def run(self, rows: List[Row], outputs: Optional[Sequence[str]] = None):
        """[len(rows), dim] embeddings before the model's Normalize module, or [len(rows), labels]
        logits; with outputs (an embedding model's: "dense", "sparse", "colbert", "tokens"), {output:
        dense [len(rows), dim] as above, or a list of each row's (SentenceEncoder.outputs_of_ids)}."""
        if outputs is not None:
            return self.encoder.outputs_of_ids([r.ids for r in rows], [r.skip for r in rows], outputs,
                                               normalize=False, task=[r.task for r in rows])
        if self.kind == EMBED:
            return self.encoder.embed_ids([r.ids for r in rows], [r.skip for r in rows], normalize=False,
                                          task=[r.task for r in rows])
        return self.cross._scores(rows)

    def scores(self, logits, raw: bool) -> torch.Tensor:
        """Logits (a tensor or a numpy array) -> the scores a reranker or classifier reports: the
        model's activation (sigmoid for one label) or, with several labels, softmax; raw: the
        logits."""
        logits = torch.as_tensor(logits)
        if raw:
            return logits
        if self.kind == RERANK:
            return self.cross.activation_fn(logits)
        return torch.softmax(logits, dim=-1)

    def warm_up(self, max_batch_tokens: int) -> int:
        """Run a batch in every power-of-two token bucket up to max_batch_tokens, so that what a
        first call costs (the GEMM path timed at the first product of each token bucket) is paid
        now, not by a client; returns the batches run. Each batch holds warm_up_tokens(bucket)
        tokens, a ragged count such as clients' batches have rather than the bucket's power of two:
        the GEMM paths are ranked at the size they are timed at, and their standing moves with the
        exact count (oneDNN's product among the fastest at 512 and 600 rows, behind at 535:
        benchmarks/LOG.md, "fp32 batches: every GEMM path in the one-call layer")."""
        longest = self.max_input_length
        token = (self.model.config.pad_token_id or 0) + 1  # any id but padding
        bucket, runs = 1, 0
        while True:
            tokens = min(warm_up_tokens(bucket), max_batch_tokens)
            rows = [Row([token] * min(longest, tokens - done), [0] * min(longest, tokens - done))
                    for done in range(0, tokens, longest)]
            if self.kind == EMBED and "dense" not in self.outputs:
                self.run(rows, ("sparse",))  # a SPLADE model: its sparse output is the one it has
            else:
                self.run(rows)
            runs += 1
            if bucket >= max_batch_tokens:
                return runs
            bucket *= 2

