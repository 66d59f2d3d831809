"""Token masking for masked-language-model pretraining: the rule of fastbert.masking.mask_tokens
(the C++ extension is bit-identical to mask_tokens below).

Random numbers: draw(stream, row b, index j) = philox_uint32(seed, (4 * b + stream) * 2**32 + j),
stream 0 = selection, 1 = outcome, 2 = random replacement id; a row's draws depend on (seed, b) only.
uniform(w, m) = (w * m) >> 32 turns a draw w into an integer in [0, m) (off uniform by < m / 2**32).
  candidates: tokens with attention_mask != 0, special_tokens_mask == 0 and (when special_token_ids
      is given) an id not in special_token_ids; n of them in the row, at positions c[0] < c[1] < ...
  "count" selection (BERT's rule) of k = mlm_prediction_count(n) tokens:
      single tokens: Floyd's sampling, k candidates out of n without replacement: for j = n-k .. n-1,
          t = uniform(draw(0, b, j), j + 1); pick candidate t, or candidate j if t is picked already;
      whole words (word_start_mask): a word is a candidate that starts a word (or whose left
          neighbour is not a candidate) with the candidates after it that do not start one. Words
          are walked in increasing (draw(0, b, first position), first position); a word is taken
          whole when it fits in what is left of k and skipped when it does not; the walk ends at k.
          If nothing fits (every word longer than k), the first word no longer than max_predictions
          is taken, so a row with a candidate always predicts something.
  "bernoulli" selection (transformers' collator): the units (tokens or words) whose draw(0, b, first
      position) < floor(p * 2**32); past max_predictions tokens, the walk above in key order.
  outcome of the t-th selected token (in position order), u = draw(1, b, t):
      u < floor(mask_replace_prob * 2**32) -> mask_token_id;
      u < floor(min(1, mask_replace_prob + random_replace_prob) * 2**32) -> a random ordinary id;
      otherwise unchanged. labels: the original id at selected tokens, -100 elsewhere.
  random ordinary id: excluded ids E = special_token_ids + [mask_token_id] when special_token_ids is
      given, else mask_token_id and every id found at a special or padding position of the batch;
      r = uniform(draw(2, b, t), vocab_size - |E|), and the id is the r-th one (from 0) not in E.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from fastbert.reference.philox import check_seed, philox_uint32

MLM_IGNORE_INDEX = -100
MLM_STREAM_KEY, MLM_STREAM_OUTCOME, MLM_STREAM_RANDOM = 0, 1, 2
MLM_SELECTIONS = ("count", "bernoulli")
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


def _exclusions(ids, ordinary_pos, mask_token_id: int, vocab_size: int, special_token_ids):
    """(candidate [rows, seq], gaps, ordinary): the selectable tokens, and the ids a random
    replacement may take: the r-th ordinary id is r + #{j: gaps[j] <= r}, `ordinary` of them."""
    candidate = ordinary_pos.clone()
    if special_token_ids is not None:
        candidate &= ~torch.isin(ids, torch.tensor(list(special_token_ids), dtype=torch.int64))
        excluded = set(int(v) for v in special_token_ids)
    else:
        excluded = set(ids[~ordinary_pos].tolist())
    excluded = torch.tensor(sorted(excluded | {int(mask_token_id)}), dtype=torch.int64)
    return candidate, excluded - torch.arange(len(excluded)), vocab_size - len(excluded)


def _count_selection(cand, starts_row, k, budget: int, max_predictions: Optional[int]):
    """Positions "count" selection takes from one row: Floyd's sampling, or whole words."""
    if starts_row is None:  # Floyd's sampling of `budget` candidates
        positions = [i for i, c in enumerate(cand) if c]
        picked = set()
        for j in range(len(positions) - budget, len(positions)):
            t = (k[j] * (j + 1)) >> 32
            picked.add(j if t in picked else t)
        return [positions[t] for t in picked]
    units = sorted(mlm_units(cand, starts_row), key=lambda u: (k[u[0]], u[0]))
    taken = mlm_walk(units, budget)
    if not taken:  # every word is longer than the budget
        limit = math.inf if max_predictions is None else max_predictions
        first = next((u for u in units if u[1] <= limit), None)
        if first is not None:
            taken = list(range(first[0], first[0] + first[1]))
    return taken


def _select_row(cand, starts_row, k, selection: str, mlm_probability: float, max_predictions: Optional[int]):
    """The positions of one row to predict (unsorted)."""
    n = sum(cand)
    if n == 0:
        return []
    if selection == "count":
        budget = mlm_prediction_count(n, mlm_probability, max_predictions)
        return _count_selection(cand, starts_row, k, budget, max_predictions) if budget else []
    t_select = _threshold32(mlm_probability)
    units = mlm_units(cand, starts_row)
    units = sorted((u for u in units if k[u[0]] < t_select), key=lambda u: (k[u[0]], u[0]))
    return mlm_walk(units, max_predictions)


def mask_tokens(input_ids: torch.Tensor, *, mask_token_id: int, vocab_size: int,
                special_tokens_mask: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                mlm_probability: float = 0.15, mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1,
                max_predictions: Optional[int] = None, word_start_mask: Optional[torch.Tensor] = None, seed: int = 0,
                special_token_ids: Optional[Sequence[int]] = None, selection: str = "count"):
    """(masked_input_ids, labels), int64 [batch, seq], by the rule above, one row at a time.
    Arguments are trusted (fastbert.masking.mask_tokens checks them)."""
    seed = check_seed(seed)
    if selection not in MLM_SELECTIONS:
        raise ValueError(f"mask_tokens: selection must be one of {MLM_SELECTIONS}, got {selection!r}")
    device = input_ids.device
    ids = input_ids.to(torch.int64).cpu()
    rows, seq = ids.shape
    ordinary_pos = torch.ones(rows, seq, dtype=torch.bool)  # neither special nor padding
    if attention_mask is not None:
        ordinary_pos &= attention_mask.cpu() != 0
    if special_tokens_mask is not None:
        ordinary_pos &= special_tokens_mask.cpu() == 0
    candidate, gaps, ordinary = _exclusions(ids, ordinary_pos, mask_token_id, vocab_size, special_token_ids)
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
    for b in range(rows):
        starts_row = None if starts is None else starts[b].tolist()
        taken = _select_row(candidate[b].tolist(), starts_row, key[b].tolist(), selection, mlm_probability,
                            max_predictions)
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
