"""What a sentence encoder gives besides its dense embedding, from the same forward: sparse lexical
weights and ColBERT multi-vectors, as BGE-M3 computes them (FlagEmbedding's BGEM3FlagModel), and
SPLADE's sparse vectors over the vocabulary (sentence-transformers' SparseEncoder: an MLM head,
log(1 + relu) and a max over the tokens: `splade`).

BGE-M3's directory holds two heads beside the encoder, each the state dict of an nn.Linear:

    sparse_linear.pt   [hidden] -> 1: a token's weight is relu(linear(its last hidden state));
                       a text's sparse vector keeps, per token id, the largest weight of its
                       occurrences, leaving out the special tokens (cls, eos, pad, unk) and zeros
    colbert_linear.pt  [hidden] -> [dim]: each token's vector but the first (the cls token's),
                       L2-normalised: a text's multi-vector has one row per token after the first,
                       padding left out

Scores as BGE-M3 defines them: dense, the dot product of the normalised embeddings; sparse, the sum
over shared token ids of the two weights' product (sparse_score); ColBERT, the mean over the query's
vectors of the largest dot product with any of the passage's (colbert_score).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

SPARSE_FILE = "sparse_linear.pt"
COLBERT_FILE = "colbert_linear.pt"
HEAD_FILES = {"sparse": SPARSE_FILE, "colbert": COLBERT_FILE}
OUTPUTS = ("dense", "sparse", "colbert", "all")


def _linear(path: str, hidden: int, where: str) -> nn.Linear:
    """The nn.Linear whose state dict the file holds (its input width must be the encoder's)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torch.load failure names the file, not what it was for
        raise ValueError(f"{where}: {path} is not a linear layer's state dict ({type(e).__name__}: {e})") from None
    weight, bias = (state.get("weight"), state.get("bias")) if isinstance(state, dict) else (None, None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden:
        raise ValueError(f"{where}: {path} must hold a linear layer's weight [out, {hidden}], got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    linear = nn.Linear(hidden, weight.shape[0], bias=bias is not None)
    linear.load_state_dict({"weight": weight, **({"bias": bias} if bias is not None else {})})
    return linear.eval()


def special_ids(root: str, config) -> List[int]:
    """The ids of the tokens BGE-M3's sparse vectors leave out: cls, eos, pad and unk, as the
    tokenizer's config names them (tokenizer_config.json, tokenizer.json's vocabulary), else the
    model config's bos / eos / pad ids."""
    names = {}
    cfg_file = os.path.join(root, "tokenizer_config.json")
    if os.path.isfile(cfg_file):
        with open(cfg_file, encoding="utf-8") as f:
            cfg = json.load(f)
        for role in ("cls_token", "eos_token", "pad_token", "unk_token"):
            token = cfg.get(role)
            names[role] = token.get("content") if isinstance(token, dict) else token
    ids = set()
    tok_file = os.path.join(root, "tokenizer.json")
    if names and os.path.isfile(tok_file):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tok_file)
        ids = {tok.token_to_id(t) for t in names.values() if isinstance(t, str)} - {None}
    if not ids:
        ids = {getattr(config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")} - {None}
    return sorted(int(i) for i in ids)


def _first_module(path: str) -> dict:
    modules = os.path.join(path, "modules.json")
    if not os.path.isfile(modules):
        return {}
    with open(modules, encoding="utf-8") as f:
        return (json.load(f) or [{}])[0]


def _splade(first: dict) -> bool:
    return str(first.get("type", "")).endswith("MLMTransformer")


def head_files(path: str) -> Dict[str, str]:
    """{head ("sparse", "colbert"): its file} of the BGE-M3 heads a sentence-transformers directory
    ships, each found beside its modules.json or else in its Transformer module's directory; none for
    a SPLADE model (MLMTransformer first)."""
    first = _first_module(path)
    if _splade(first):
        return {}
    places = [path, os.path.join(path, first.get("path", ""))]
    found = {}
    for name, file in HEAD_FILES.items():
        for place in places:
            if os.path.isfile(os.path.join(place, file)):
                found[name] = os.path.join(place, file)
                break
    return found


def outputs_in(path: str) -> frozenset:
    """What the model of a sentence-transformers directory gives: a SPLADE model's "sparse" alone;
    another's "dense" and "tokens" (every token's last hidden state), and its BGE-M3 heads' outputs
    (head_files)."""
    if _splade(_first_module(path)):
        return frozenset({"sparse"})
    return frozenset({"dense", "tokens", *head_files(path)})


def lacking(missing: Sequence[str], given: frozenset) -> str:
    """Why a model that gives `given` (outputs_in) gives none of `missing`, in one line."""
    if "dense" not in given:
        return "a SPLADE model gives sparse vectors only"
    return (f"the model has no {' or '.join(missing)} head ({', '.join(HEAD_FILES[m] for m in missing)} beside its "
            "config, as BGE-M3 ships them)")


def on_cpu(value, numpy: bool):
    """One text's output (a tensor, or sparse's (ids, weights)) on the CPU; numpy arrays with numpy
    (bf16 as fp32, which numpy lacks)."""
    if isinstance(value, tuple):
        return tuple(on_cpu(t, numpy) for t in value)
    value = value.detach().cpu()
    if not numpy:
        return value
    return (value.float() if value.dtype == torch.bfloat16 else value).numpy()


class TokenHeads(nn.Module):
    """BGE-M3's sparse and ColBERT heads (either may be absent) over an encoder's last hidden state."""

    def __init__(self, sparse: Optional[nn.Linear], colbert: Optional[nn.Linear], skip_ids: Sequence[int]):
        super().__init__()
        self.sparse_linear = sparse
        self.colbert_linear = colbert
        self.register_buffer("skip_ids", torch.tensor(sorted(skip_ids), dtype=torch.long), persistent=False)

    @classmethod
    def load(cls, path: str, hidden: int, skip_ids: Sequence[int], where: str) -> Optional["TokenHeads"]:
        """The heads a sentence-transformers directory ships (head_files); None where it ships none."""
        files = head_files(path)
        if not files:
            return None
        return cls(*(_linear(files[name], hidden, where) if name in files else None for name in HEAD_FILES),
                   skip_ids)

    def sparse(self, hidden: torch.Tensor, input_ids: torch.Tensor,
               mask: torch.Tensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per row of hidden [batch, seq, width] (input_ids, mask [batch, seq]): (token ids int64,
        ascending; their weights float32), each id's largest weight, zeros and special tokens left out."""
        w = torch.relu(self.sparse_linear(hidden.to(self.sparse_linear.weight.dtype))).squeeze(-1).float()
        keep = mask.bool() & (w > 0) & ~torch.isin(input_ids, self.skip_ids)
        rows, cols = keep.nonzero(as_tuple=True)
        vocab = int(input_ids.max()) + 1 if input_ids.numel() else 1
        # one (row, id) key per kept token: the largest weight of each key, keys in order (row, then id)
        keys, inverse = torch.unique(rows * vocab + input_ids[rows, cols], return_inverse=True)
        best = torch.zeros(keys.shape[0], dtype=torch.float32, device=w.device)
        best.scatter_reduce_(0, inverse, w[rows, cols], "amax", include_self=False)
        counts = torch.bincount(keys // vocab, minlength=hidden.shape[0]).tolist()
        return list(zip((keys % vocab).split(counts), best.split(counts)))

    def colbert(self, hidden: torch.Tensor, mask: torch.Tensor) -> List[torch.Tensor]:
        """Per row of hidden [batch, seq, width]: its tokens' vectors after the first [n - 1, dim]
        (n: the row's tokens, mask [batch, seq] right-padded), L2-normalised, float32."""
        vecs = self.colbert_linear(hidden[:, 1:].to(self.colbert_linear.weight.dtype)).float()
        vecs = torch.nn.functional.normalize(vecs * mask[:, 1:, None].to(vecs.dtype), dim=-1)
        lengths = (mask.sum(1) - 1).clamp(min=0).tolist()
        return [v[:n] for v, n in zip(vecs, lengths)]


SPLADE_POOLING = ("max", "sum")


def splade(logits: torch.Tensor, mask: torch.Tensor, pooling: str = "max") -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """SPLADE's sparse vectors (sentence-transformers' SpladePooling): per row of the MLM logits
    [batch, seq, vocab] (mask [batch, seq]), log(1 + relu(logit)) of its tokens pooled over them
    ("max" or "sum") -> (the vocabulary ids with a weight above 0, ascending; their weights float32).
    A row at a time, so that the [seq, vocab] intermediate is one row's."""
    out = []
    for row, m in zip(logits, mask.bool()):
        w = torch.log1p(torch.relu(row[m].float()))
        pooled = w.amax(0) if pooling == "max" else w.sum(0)
        ids = pooled.nonzero().squeeze(1)
        out.append((ids, pooled[ids]))
    return out


def sparse_score(a, b) -> float:
    """BGE-M3's lexical matching score of two sparse vectors (ids, weights), numpy or torch: the sum
    over the ids both have of the two weights' product."""
    ids_a, w_a = (torch.as_tensor(x) for x in a)
    ids_b, w_b = (torch.as_tensor(x) for x in b)
    order = torch.argsort(ids_b)
    ids_b, w_b = ids_b[order], w_b[order]
    shared = torch.isin(ids_a, ids_b)
    at = torch.searchsorted(ids_b, ids_a[shared])
    return float((w_a[shared].double() * w_b[at].double()).sum())


def colbert_score(query, passage) -> float:
    """BGE-M3's ColBERT score: the mean over the query's vectors of the largest dot product with
    any of the passage's."""
    q, p = torch.as_tensor(query).float(), torch.as_tensor(passage).float()
    if q.shape[0] == 0 or p.shape[0] == 0:
        return 0.0
    return float((q @ p.t()).max(dim=1).values.mean())
