"""Plain PyTorch reference layers: the ground truth every kernel is tested against.

They are written for clarity, not speed, and they are also the "torch" backend of fastbert.ops.

Dropout everywhere in fastbert uses one counter-based rule, so every backend draws the same mask
from the same seed (and the backward regenerates it instead of storing it):
    element (row r, col c) of the op's [rows, cols] view has counter offset = r * cols + c;
    u = word 0 of Philox-4x32-10 with counter (lo32(offset), hi32(offset), 0, 0), key (lo32(seed), hi32(seed))
        (exactly triton.language.randint(seed, offset));
    the element is kept when (u >> 8) >= dropout_threshold(p) = floor(p * 2**24), scaled by 1 / (1 - p).
Attention dropout (on the softmax probabilities) uses the same rule with its own counter:
    probability (sequence b, head h, query i, key j) has offset = (b * heads + h) * 2**32 + i * 2**16 + j,
    i and j counted from the sequence's first real token (so the padded and the packed layouts of a
    batch draw the same mask); sequences are at most 2**16 tokens long when dropout is on.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

_M32 = 0xFFFFFFFF
_PHILOX_ROUND_A = 0xD2511F53
_PHILOX_ROUND_B = 0xCD9E8D57
_PHILOX_KEY_A = 0x9E3779B9
_PHILOX_KEY_B = 0xBB67AE85


def _mulhilo(a: int, b: torch.Tensor):
    """(high 32 bits, low 32 bits) of a * b for a uint32 constant and a tensor of uint32 in int64."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b >> 16, b & 0xFFFF
    lo_lo = a_lo * b_lo
    mid1 = a_hi * b_lo
    mid2 = a_lo * b_hi
    hi_hi = a_hi * b_hi
    mid = (lo_lo >> 16) + (mid1 & 0xFFFF) + (mid2 & 0xFFFF)
    lo = ((mid & 0xFFFF) << 16) | (lo_lo & 0xFFFF)
    hi = hi_hi + (mid1 >> 16) + (mid2 >> 16) + (mid >> 16)
    return hi & _M32, lo & _M32


def check_seed(seed) -> int:
    """`seed` as an int, checked to lie in [0, 2**63) (the range every backend takes)."""
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"fastbert: dropout seed must be in [0, 2**63), got {seed}")
    return int(seed)


def philox_uint32(seed, offsets: torch.Tensor) -> torch.Tensor:
    """Philox-4x32-10 word 0 for each int64 counter in `offsets` (uint32 values held in int64).

    `seed` is a Python int in [0, 2**63) or a one-element int64 tensor (traceable by torch.compile).
    Bit-identical to triton.language.randint(seed, offsets) and to the C++ extension.
    """
    if isinstance(seed, torch.Tensor):
        seed = seed.reshape(()).to(device=offsets.device, dtype=torch.int64)
    else:
        seed = check_seed(seed)
    offsets = offsets.to(torch.int64)
    c0 = offsets & _M32
    c1 = (offsets >> 32) & _M32
    c2 = torch.zeros_like(offsets)
    c3 = torch.zeros_like(offsets)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _PHILOX_KEY_A) & _M32
        k1 = (k1 + _PHILOX_KEY_B) & _M32
    return c0


def dropout_threshold(p: float) -> int:
    """The 24-bit threshold below which a random word drops its element (see the module docstring)."""
    return int(math.floor(p * (1 << 24)))


def dropout_keep_mask(seed, shape: Sequence[int], p: float, device=None) -> torch.Tensor:
    """Bool mask of kept elements for an op whose inputs have `shape` (last dim = cols)."""
    shape = tuple(shape)
    n = math.prod(shape)
    offsets = torch.arange(n, dtype=torch.int64, device=device)
    u = philox_uint32(seed, offsets)
    return ((u >> 8) >= dropout_threshold(p)).reshape(shape)


def new_seed(generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A fresh dropout seed, an int64 tensor of shape [1] drawn from torch's CPU random state
    (torch.manual_seed makes runs repeatable; a tensor, not an int, so torch.compile traces it)."""
    return torch.randint(0, 2**62, (1,), generator=generator, dtype=torch.int64)


# --------------------------------------------------------------------------------------------
# bias + GELU


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias) over the last dim; "none" is the exact erf form, "tanh" the approximation."""
    return F.gelu(x + bias.to(x.dtype), approximate=approximate)


class BiasGelu(nn.Module):
    def __init__(self, hidden: int, approximate: str = "none"):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.approximate = approximate

    def forward(self, x):
        return bias_gelu(x, self.bias, self.approximate)


# --------------------------------------------------------------------------------------------
# dropout + residual add + LayerNorm


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-12,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    keep_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """layer_norm(dropout(x) + residual) over the last dim, with the fastbert dropout rule.

    The mask comes from `keep_mask` when given, else from `seed` (an int or an int64 tensor of
    shape [1]; a fresh one when None).
    """
    if dropout_p > 0.0:
        if keep_mask is None:
            keep_mask = dropout_keep_mask(new_seed() if seed is None else seed, x.shape, dropout_p, x.device)
        x = x * keep_mask.to(x.dtype) * (1.0 / (1.0 - dropout_p))
    h = x + residual
    return F.layer_norm(h, (h.shape[-1],), weight.to(h.dtype), bias.to(h.dtype), eps)


class AddLayerNorm(nn.Module):
    """BERT's BertSelfOutput / BertOutput tail: LayerNorm(dropout(x) + residual)."""

    def __init__(self, hidden: int, eps: float = 1e-12, dropout_p: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.eps = eps
        self.dropout_p = dropout_p

    def forward(self, x, residual, seed=None):
        p = self.dropout_p if self.training else 0.0
        return add_layer_norm(x, residual, self.weight, self.bias, self.eps, p, seed)


# --------------------------------------------------------------------------------------------
# attention with a padding mask

MAX_DROPOUT_SEQLEN = 1 << 16  # attention dropout counters hold a query and a key position in 16 bits each


def attention_dropout_offsets(
    batch: int, heads: int, seq_q: int, seq_k: int, starts: Optional[torch.Tensor] = None, device=None
) -> torch.Tensor:
    """int64 [batch, heads, seq_q, seq_k]: the attention dropout counter of each probability (see the
    module docstring). starts: int [batch], each sequence's first real position (zeros when None)."""
    if max(seq_q, seq_k) > MAX_DROPOUT_SEQLEN:
        raise ValueError(
            f"attention dropout takes sequences of at most {MAX_DROPOUT_SEQLEN} tokens, got {max(seq_q, seq_k)}"
        )
    b = torch.arange(batch, dtype=torch.int64, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, dtype=torch.int64, device=device).view(1, -1, 1, 1)
    i = torch.arange(seq_q, dtype=torch.int64, device=device).view(1, 1, -1, 1)
    j = torch.arange(seq_k, dtype=torch.int64, device=device).view(1, 1, 1, -1)
    if starts is not None:
        st = starts.to(device=device, dtype=torch.int64).view(-1, 1, 1, 1)
        i, j = (i - st) & 0xFFFF, (j - st) & 0xFFFF  # positions before the start are padding anyway
    return ((b * heads + h) << 32) + (i << 16) + j


def attention_keep_mask(
    seed, batch: int, heads: int, seq_q: int, seq_k: int, p: float, starts: Optional[torch.Tensor] = None, device=None
) -> torch.Tensor:
    """bool [batch, heads, seq_q, seq_k]: the probabilities attention dropout keeps, for `seed`."""
    u = philox_uint32(seed, attention_dropout_offsets(batch, heads, seq_q, seq_k, starts, device))
    return (u >> 8) >= dropout_threshold(p)


def mask_starts(attention_mask: torch.Tensor) -> torch.Tensor:
    """int64 [batch]: the first real position of each row of a [batch, seq] mask (0 for a row with none)."""
    m = attention_mask.to(torch.bool)
    return torch.where(m.any(-1), m.to(torch.int8).argmax(-1), 0).to(torch.int64)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    keep_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, spelled out; q, k, v: [batch, heads, seq, head_dim].

    attention_mask: [batch, seq], 1/True = real token. Padded keys get no weight; padded queries
    return zeros (and pass no gradient), and so does a query with no real key. keep_mask
    ([batch, heads, seq, seq] bool) applies dropout to the probabilities when dropout_p > 0 (drawn
    with torch's RNG when not given; attention_keep_mask gives fastbert's counter-based mask).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if attention_mask is not None:
        keys = attention_mask.to(torch.bool)[:, None, None, :]
        scores = scores.masked_fill(~keys, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows with no real key: all -inf -> zeros
    probs = probs.to(q.dtype)
    if dropout_p > 0.0:
        if keep_mask is None:
            keep_mask = torch.rand_like(probs, dtype=torch.float32) >= dropout_p
        probs = probs * keep_mask.to(probs.dtype) / (1.0 - dropout_p)
    out = torch.matmul(probs, v)
    if attention_mask is not None:
        out = out * attention_mask.to(out.dtype)[:, None, :, None]
    return out


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    keep_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """attention over packed sequences, one at a time; q, k, v: [total_tokens, heads, head_dim],
    cu_seqlens: [batch + 1], sequence b is tokens cu_seqlens[b]:cu_seqlens[b + 1].
    keep_mask: bool [batch, heads, >= max_seqlen, >= max_seqlen] (sequence b uses its top-left corner)."""
    out = torch.zeros_like(q)
    bounds = cu_seqlens.tolist()
    for b in range(len(bounds) - 1):
        lo, hi = bounds[b], bounds[b + 1]
        if hi == lo:
            continue
        qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        keep = None if keep_mask is None else keep_mask[b : b + 1, :, : hi - lo, : hi - lo]
        o = attention(qs, ks, vs, None, dropout_p, scale, keep)
        out[lo:hi] = o.squeeze(0).transpose(0, 1)
    return out


class Attention(nn.Module):
    def __init__(self, dropout_p: float = 0.0, scale: Optional[float] = None):
        super().__init__()
        self.dropout_p = dropout_p
        self.scale = scale

    def forward(self, q, k, v, attention_mask=None):
        p = self.dropout_p if self.training else 0.0
        return attention(q, k, v, attention_mask, p, self.scale)


# --------------------------------------------------------------------------------------------
# token masking for masked-language-model pretraining
#
# The rule of fastbert.masking.mask_tokens (the C++ extension is bit-identical to mask_tokens below).
# Random numbers: draw(stream, row b, index j) = philox_uint32(seed, (4 * b + stream) * 2**32 + j),
# stream 0 = selection, 1 = outcome, 2 = random replacement id; a row's draws depend on (seed, b) only.
# uniform(w, m) = (w * m) >> 32 turns a draw w into an integer in [0, m) (off uniform by < m / 2**32).
#   candidates: tokens with attention_mask != 0, special_tokens_mask == 0 and (when special_token_ids
#       is given) an id not in special_token_ids; n of them in the row, at positions c[0] < c[1] < ...
#   "count" selection (BERT's rule) of k = mlm_prediction_count(n) tokens:
#       single tokens: Floyd's sampling, k candidates out of n without replacement: for j = n-k .. n-1,
#           t = uniform(draw(0, b, j), j + 1); pick candidate t, or candidate j if t is picked already;
#       whole words (word_start_mask): a word is a candidate that starts a word (or whose left
#           neighbour is not a candidate) with the candidates after it that do not start one. Words
#           are walked in increasing (draw(0, b, first position), first position); a word is taken
#           whole when it fits in what is left of k and skipped when it does not; the walk ends at k.
#           If nothing fits (every word longer than k), the first word no longer than max_predictions
#           is taken, so a row with a candidate always predicts something.
#   "bernoulli" selection (transformers' collator): the units (tokens or words) whose draw(0, b, first
#       position) < floor(p * 2**32); past max_predictions tokens, the walk above in key order.
#   outcome of the t-th selected token (in position order), u = draw(1, b, t):
#       u < floor(mask_replace_prob * 2**32) -> mask_token_id;
#       u < floor(min(1, mask_replace_prob + random_replace_prob) * 2**32) -> a random ordinary id;
#       otherwise unchanged. labels: the original id at selected tokens, -100 elsewhere.
#   random ordinary id: excluded ids E = special_token_ids + [mask_token_id] when special_token_ids is
#       given, else mask_token_id and every id found at a special or padding position of the batch;
#       r = uniform(draw(2, b, t), vocab_size - |E|), and the id is the r-th one (from 0) not in E.

MLM_IGNORE_INDEX = -100
MLM_STREAM_KEY, MLM_STREAM_OUTCOME, MLM_STREAM_RANDOM = 0, 1, 2
_MLM_STREAMS = 4


def mlm_prediction_count(candidates: int, mlm_probability: float, max_predictions: Optional[int] = None) -> int:
    """Tokens "count" selection predicts in a row with `candidates` candidates: round(candidates * p)
    (half to even, as Python's round), at least 1, at most max_predictions; 0 with no candidate or p = 0."""
    if candidates == 0 or mlm_probability == 0:
        return 0
    k = max(1, round(candidates * mlm_probability))
    return k if max_predictions is None else min(k, max_predictions)


def mlm_draws(seed: int, stream: int, rows: int, seq: int) -> torch.Tensor:
    """int64 [rows, seq]: the 32-bit word draw(stream, b, i) of every row b and position i."""
    offsets = (torch.arange(rows, dtype=torch.int64)[:, None] * _MLM_STREAMS + stream) * 2**32
    return philox_uint32(seed, offsets + torch.arange(seq, dtype=torch.int64)[None, :])


def _threshold32(p: float) -> int:
    return math.floor(p * 2**32)


def mlm_units(candidate: Sequence[bool], word_start: Optional[Sequence[bool]] = None):
    """The units of one row as (first position, length): every candidate alone, or whole words."""
    units = []
    seq = len(candidate)
    i = 0
    while i < seq:
        if not candidate[i]:
            i += 1
            continue
        first = i
        i += 1
        if word_start is not None:
            while i < seq and candidate[i] and not word_start[i]:
                i += 1
        units.append((first, i - first))
    return units


def mlm_walk(units, budget: Optional[int]):
    """Positions taken by walking `units` (in order): a unit is taken whole when it fits in what is
    left of `budget` (None: no limit) and skipped when it does not; the walk ends at the budget."""
    taken = []
    for first, length in units:
        if budget is not None and len(taken) >= budget:
            break
        if budget is not None and len(taken) + length > budget:
            continue
        taken.extend(range(first, first + length))
    return taken


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_tokens_mask: Optional[torch.Tensor] = None,
    attention_mask: Optional[torch.Tensor] = None,
    mlm_probability: float = 0.15,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    max_predictions: Optional[int] = None,
    word_start_mask: Optional[torch.Tensor] = None,
    seed: int = 0,
    special_token_ids: Optional[Sequence[int]] = None,
    selection: str = "count",
):
    """(masked_input_ids, labels), int64 [batch, seq], by the rule above, one row at a time.
    Arguments are trusted (fastbert.masking.mask_tokens checks them)."""
    seed = check_seed(seed)
    if selection not in ("count", "bernoulli"):
        raise ValueError(f"mask_tokens: selection must be 'count' or 'bernoulli', got {selection!r}")
    device = input_ids.device
    ids = input_ids.to(torch.int64).cpu()
    rows, seq = ids.shape
    ordinary_pos = torch.ones(rows, seq, dtype=torch.bool)  # neither special nor padding
    if attention_mask is not None:
        ordinary_pos &= attention_mask.cpu() != 0
    if special_tokens_mask is not None:
        ordinary_pos &= special_tokens_mask.cpu() == 0
    candidate = ordinary_pos.clone()
    if special_token_ids is not None:
        candidate &= ~torch.isin(ids, torch.tensor(list(special_token_ids), dtype=torch.int64))
        excluded = set(int(v) for v in special_token_ids)
    else:
        excluded = set(ids[~ordinary_pos].tolist())
    excluded = torch.tensor(sorted(excluded | {int(mask_token_id)}), dtype=torch.int64)
    gaps = excluded - torch.arange(len(excluded))  # the r-th ordinary id is r + #{j: gaps[j] <= r}
    ordinary = vocab_size - len(excluded)
    t_mask = _threshold32(mask_replace_prob)
    t_random = _threshold32(min(1.0, mask_replace_prob + random_replace_prob))
    if t_random > t_mask and ordinary < 1:
        raise ValueError("mask_tokens: random replacements need an ordinary id, but every id is special")

    key = mlm_draws(seed, MLM_STREAM_KEY, rows, seq)
    outcome = mlm_draws(seed, MLM_STREAM_OUTCOME, rows, seq)
    random_r = (mlm_draws(seed, MLM_STREAM_RANDOM, rows, seq) * max(ordinary, 0)) >> 32
    random_id = random_r + torch.searchsorted(gaps, random_r, right=True)

    out = ids.clone()
    labels = torch.full_like(ids, MLM_IGNORE_INDEX)
    starts = None if word_start_mask is None else (word_start_mask.cpu() != 0)
    t_select = _threshold32(mlm_probability)
    for b in range(rows):
        cand = candidate[b].tolist()
        positions = [i for i, c in enumerate(cand) if c]
        n = len(positions)
        k = key[b].tolist()
        if n == 0:
            continue
        if selection == "count":
            budget = mlm_prediction_count(n, mlm_probability, max_predictions)
            if budget == 0:
                continue
            if starts is None:  # Floyd's sampling of `budget` candidates
                picked = set()
                for j in range(n - budget, n):
                    t = (k[j] * (j + 1)) >> 32
                    picked.add(j if t in picked else t)
                taken = [positions[t] for t in picked]
            else:
                units = sorted(mlm_units(cand, starts[b].tolist()), key=lambda u: (k[u[0]], u[0]))
                taken = mlm_walk(units, budget)
                if not taken:  # every word is longer than the budget
                    limit = math.inf if max_predictions is None else max_predictions
                    first = next((u for u in units if u[1] <= limit), None)
                    if first is not None:
                        taken = list(range(first[0], first[0] + first[1]))
        else:
            units = mlm_units(cand, None if starts is None else starts[b].tolist())
            units = sorted((u for u in units if k[u[0]] < t_select), key=lambda u: (k[u[0]], u[0]))
            taken = mlm_walk(units, max_predictions)
        if not taken:
            continue
        pos = torch.tensor(sorted(taken), dtype=torch.int64)
        rank = torch.arange(len(pos))
        labels[b, pos] = ids[b, pos]
        u = outcome[b, rank]
        to_mask = u < t_mask
        to_random = ~to_mask & (u < t_random)
        out[b, pos[to_mask]] = mask_token_id
        out[b, pos[to_random]] = random_id[b, rank[to_random]]
    return out.to(device), labels.to(device)


def word_start_table(vocab: Sequence[str]) -> torch.Tensor:
    """bool [len(vocab)]: True where a WordPiece token starts a word, False for "##" continuations."""
    return torch.tensor([not token.startswith("##") for token in vocab], dtype=torch.bool)


def word_starts(input_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """bool like input_ids: True where the token starts a word (table from word_start_table)."""
    return table.to(input_ids.device)[input_ids.to(torch.int64)]
