"""Batches for pretraining: which instances each process reads at each step, and the masked batch.

The order is a function of (seed, epoch) only: every process computes the same permutation of the
split, global batch g of an epoch is its slice [g * B * W, (g + 1) * B * W) and process r reads the
r-th block of B of it (B the per-process batch, W the number of processes). The masks are a
function of (seed, global batch number, rank): a new mask every time an instance is read again
(every epoch), the same masks when a run is resumed. Held-out batches have fixed masks, a function
of the batch number only, whatever the number of processes.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from fastbert.data import PretrainingCollator
from fastbert.data.pretraining_shards import InstanceDataset
from fastbert.masking import word_start_table

_MASK_STREAM = 1
_EVAL_STREAM = 2


def stream_seed(*words: int) -> int:
    """A seed in [0, 2**63) from integers (numpy's SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def features(rows: Sequence) -> List[dict]:
    """Collator features of dataset rows (input_ids, length of [CLS] A [SEP], next-sentence label)."""
    out = []
    for ids, a_len, label in rows:
        types = np.zeros(len(ids), np.int64)
        types[a_len:] = 1
        out.append({"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
                    "next_sentence_label": label})
    return out


def make_collator(index: dict, *, mlm_probability: float = 0.15, whole_word_mask: bool = False,
                  max_predictions: Optional[int] = None, word_starts: Optional[torch.Tensor] = None) -> PretrainingCollator:
    """The data's collator; whole-word masking needs `word_starts`, the vocabulary's bool word-start
    table (fastbert.data.vocab.word_start_table)."""
    special = {k: int(v) for k, v in index["special_tokens"].items()}
    table = None
    if whole_word_mask:
        if word_starts is None:
            raise ValueError("fastbert: whole-word masking needs the vocabulary's word-start table")
        table = word_start_table(word_starts)
    return PretrainingCollator(
        vocab_size=int(index["vocab_size"]),
        mask_token_id=special["[MASK]"],
        pad_token_id=special["[PAD]"],
        special_token_ids=sorted(special.values()),
        mlm_probability=mlm_probability,
        max_predictions=max_predictions,
        whole_word_mask=whole_word_mask,
        word_start_table=table,
        generator=torch.Generator(),
    )


class BatchPlan:
    """Per-process training batches of a split: batch(m) is the m-th micro-batch since the start of
    training (epochs follow one another)."""

    def __init__(self, dataset: InstanceDataset, collator: PretrainingCollator, *, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        self.dataset = dataset
        self.collator = collator
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.global_batch = batch_size * world_size
        self.per_epoch = len(dataset) // self.global_batch
        if self.per_epoch < 1:
            raise ValueError(
                f"fastbert: the training split has {len(dataset)} pairs, fewer than one global batch "
                f"({batch_size} x {world_size} processes); use a smaller --batch-size or more data"
            )
        self._perm_epoch = -1
        self._perm: Optional[np.ndarray] = None

    def position(self, m: int):
        return divmod(m, self.per_epoch)

    def indices(self, m: int) -> np.ndarray:
        epoch, g = self.position(m)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))
            self._perm_epoch = epoch
        start = g * self.global_batch + self.rank * self.batch_size
        return self._perm[start:start + self.batch_size]

    def batch(self, m: int) -> Dict[str, torch.Tensor]:
        rows = [self.dataset[int(i)] for i in self.indices(m)]
        self.collator.generator.manual_seed(stream_seed(self.seed, _MASK_STREAM, m, self.rank))
        return self.collator(features(rows))


class EvalPlan:
    """Held-out batches in a fixed order with fixed masks; process r evaluates batches r, r + W, ..."""

    def __init__(self, dataset: InstanceDataset, collator: PretrainingCollator, *, batch_size: int, seed: int,
                 max_batches: Optional[int] = None):
        self.dataset = dataset
        self.collator = collator
        self.batch_size = batch_size
        self.seed = seed
        n = math.ceil(len(dataset) / batch_size)
        self.num_batches = n if max_batches is None else min(n, max_batches)

    def batch(self, b: int) -> Dict[str, torch.Tensor]:
        lo = b * self.batch_size
        rows = [self.dataset[i] for i in range(lo, min(len(self.dataset), lo + self.batch_size))]
        self.collator.generator.manual_seed(stream_seed(self.seed, _EVAL_STREAM, b))
        return self.collator(features(rows))
