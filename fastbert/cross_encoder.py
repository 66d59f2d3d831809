"""Rerankers and pair classifiers from a sentence-transformers CrossEncoder directory (or any
transformers sequence-classifier checkpoint of a family fastbert runs), on fastbert's encoders.

    ce = fastbert.CrossEncoder("path/to/bge-reranker-base")
    ce.predict([("query", "a passage"), ("query", "another")])   # numpy [2] (one label) or [2, labels]
    ce.rank("query", ["a passage", "another"])                   # [{"corpus_id": 1, "score": ...}, ...]

Scores equal sentence-transformers' CrossEncoder.predict: the classifier's logits through the
model's activation (config_sentence_transformers.json's activation_fn, or config.json's
sbert_ce_default_activation_function from older versions; else sigmoid for one label, identity
for more). Pairs are tokenized as the tokenizer pairs them (truncated longest first to max_length),
batched longest first and returned in the order given.

    fastbert rerank MODEL_DIR --query "..." --input documents.txt [--top-k K]
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

import torch
from torch import nn

from fastbert.sentence import activation, load_tokenizer, longest_first, pad_batch, read_json
from fastbert.sentence import max_length as max_length_of

WHERE = "fastbert.CrossEncoder"


def _default_activation(path: str, num_labels: int) -> nn.Module:
    st_file = os.path.join(path, "config_sentence_transformers.json")
    name = read_json(st_file, "config_sentence_transformers.json", WHERE).get("activation_fn") \
        if os.path.isfile(st_file) else None
    if name is None:
        name = read_json(os.path.join(path, "config.json"), "config.json", WHERE).get(
            "sbert_ce_default_activation_function")
    if name is None:
        return nn.Sigmoid() if num_labels == 1 else nn.Identity()
    return activation(name, WHERE)


def _is_pair(x) -> bool:
    return isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(s, str) for s in x)


class CrossEncoder:
    def __init__(self, path: str, *, backend: Optional[str] = None, dtype: Optional[torch.dtype] = None,
                 device=None, max_length: Optional[int] = None, quantize: Optional[str] = None,
                 cuda_graphs: bool = True):
        from fastbert.model.auto import AutoModelForSequenceClassification

        if not os.path.isdir(path):
            raise FileNotFoundError(f"{WHERE}: {path} is not a directory")
        self.model = AutoModelForSequenceClassification.from_pretrained(path, backend=backend, dtype=dtype,
                                                                        quantize=quantize)
        if device is not None:
            self.model.to(device)
        # on CUDA the encoder replays CUDA graphs (fastbert.ops.encoder.EncoderGraphs); elsewhere a no-op
        self.model.cuda_graphs(cuda_graphs)
        self.num_labels = self.model.config.num_labels
        self.activation_fn = _default_activation(path, self.num_labels)
        self.max_length = max_length_of(path, self.model, max_length, {})
        self.tokenizer = load_tokenizer(path, self.max_length, WHERE)

    @torch.no_grad()
    def _scores(self, encodings) -> torch.Tensor:
        ids, mask = pad_batch([e.ids for e in encodings], self.model.config.pad_token_id or 0, self.model.device)
        kwargs = {}
        if self.model.config.type_vocab_size > 1:  # (RoBERTa's one type and DistilBERT's none take the default)
            kwargs["token_type_ids"] = pad_batch([e.type_ids for e in encodings], 0, self.model.device)[0]
        return self.model(input_ids=ids, attention_mask=mask, **kwargs).logits.float()

    @torch.no_grad()
    def predict(self, pairs, batch_size: int = 32, *, activation_fn=None, apply_softmax: bool = False,
                convert_to_numpy: bool = True, convert_to_tensor: bool = False, show_progress_bar: bool = False):
        """Scores of (query, document) pairs: [n] for a one-label model, else [n, labels] (a scalar
        or [labels] for a single pair)."""
        single = _is_pair(pairs)
        pairs = [tuple(pairs)] if single else [tuple(p) for p in pairs]
        if not all(_is_pair(p) for p in pairs):
            raise TypeError(f"{WHERE}.predict: pairs must be (text, text) pairs of strings")
        if batch_size < 1:
            raise ValueError(f"{WHERE}.predict: batch_size must be >= 1, got {batch_size}")
        encodings = self.tokenizer.encode_batch(pairs)
        logits = longest_first(self.model, [len(e.ids) for e in encodings], batch_size,
                               torch.empty(len(pairs), self.num_labels),
                               lambda chunk: self._scores([encodings[i] for i in chunk]), "predict", show_progress_bar)
        scores = (activation_fn or self.activation_fn)(logits)
        if apply_softmax and scores.shape[1] > 1:
            scores = torch.softmax(scores, dim=1)
        if self.num_labels == 1:
            scores = scores[:, 0]
        if single:
            scores = scores[0]
        return scores.numpy() if convert_to_numpy and not convert_to_tensor else scores

    def rank(self, query: str, documents: Sequence[str], top_k: Optional[int] = None, return_documents: bool = False,
             batch_size: int = 32, show_progress_bar: bool = False) -> List[dict]:
        """The documents by score for `query`, highest first: [{"corpus_id", "score"(, "text")}]."""
        if self.num_labels != 1:
            raise ValueError(f"{WHERE}.rank: ranking needs a model with one label, this one has {self.num_labels}")
        scores = self.predict([(query, d) for d in documents], batch_size=batch_size,
                              show_progress_bar=show_progress_bar, convert_to_tensor=True)
        order = torch.argsort(scores, descending=True, stable=True).tolist()[:top_k]
        out = [{"corpus_id": i, "score": float(scores[i])} for i in order]
        if return_documents:
            for r in out:
                r["text"] = documents[r["corpus_id"]]
        return out

