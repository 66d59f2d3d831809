"""Training instances on disk: memory-mapped numpy shards plus an index, so a data set larger than
memory is read a batch at a time.

A prepared data directory holds

  index.json                  format, version, max_seq_length, vocabulary, splits -> shards, summary
  tokenizer.json, vocab.txt   the tokenizer the ids came from (and its transformers config files)
  <split>-<k>.ids.npy         uint16 (vocabularies up to 65536) or int32 [tokens]: every instance's
                              input ids, [CLS] A [SEP] B [SEP], back to back
  <split>-<k>.offsets.npy     int64 [instances + 1]: instance i is ids[offsets[i]:offsets[i + 1]]
  <split>-<k>.info.npy        int32 [instances, 2]: (length of [CLS] A [SEP], next-sentence label)

Every file is written under a temporary name and renamed into place, and index.json is written
last: a directory without index.json is an unfinished preparation, never read as data.
"""
from __future__ import annotations

import bisect
import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

FORMAT = "fastbert-pretraining-data"
VERSION = 1
INDEX = "index.json"


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 65536 else np.int32


def _save_npy(path: str, array: np.ndarray) -> None:
    tmp = path + ".tmp.npy"
    np.save(tmp, array)
    os.replace(tmp, path)


class ShardWriter:
    """Collects instances of one split and writes a shard every `shard_size` of them, in a random
    order within the shard (the reader shuffles across shards)."""

    def __init__(self, directory: str, split: str, *, vocab_size: int, shard_size: int = 100_000, seed: int = 0):
        if shard_size < 1:
            raise ValueError(f"fastbert: shard_size must be >= 1, got {shard_size}")
        self.directory = directory
        self.split = split
        self.dtype = token_dtype(vocab_size)
        self.shard_size = shard_size
        self.rng = np.random.default_rng(seed)
        self.shards: List[dict] = []
        self._ids: List[np.ndarray] = []
        self._info: List[Tuple[int, int]] = []
        self.instances = 0
        self.tokens = 0
        self.is_next = 0
        os.makedirs(directory, exist_ok=True)

    def add(self, input_ids: np.ndarray, segment_a_length: int, label: int) -> None:
        self._ids.append(np.asarray(input_ids, self.dtype))
        self._info.append((int(segment_a_length), int(label)))
        if len(self._ids) >= self.shard_size:
            self._flush()

    def _flush(self) -> None:
        if not self._ids:
            return
        order = self.rng.permutation(len(self._ids))
        ids = [self._ids[i] for i in order]
        info = np.asarray([self._info[i] for i in order], np.int32).reshape(-1, 2)
        lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(ids) if ids else np.zeros(0, self.dtype)
        prefix = f"{self.split}-{len(self.shards):05d}"
        _save_npy(os.path.join(self.directory, prefix + ".ids.npy"), flat)
        _save_npy(os.path.join(self.directory, prefix + ".offsets.npy"), offsets)
        _save_npy(os.path.join(self.directory, prefix + ".info.npy"), info)
        n_next = int((info[:, 1] == 0).sum())
        self.shards.append({"prefix": prefix, "instances": len(ids), "tokens": int(offsets[-1]), "is_next": n_next})
        self.instances += len(ids)
        self.tokens += int(offsets[-1])
        self.is_next += n_next
        self._ids, self._info = [], []

    def close(self) -> dict:
        """Write what is left; the split's entry for index.json."""
        self._flush()
        return {"instances": self.instances, "tokens": self.tokens, "is_next": self.is_next, "shards": self.shards}


def write_index(directory: str, index: dict) -> None:
    index = dict(index, format=FORMAT, version=VERSION)
    tmp = os.path.join(directory, INDEX + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    os.replace(tmp, os.path.join(directory, INDEX))


def read_index(directory: str) -> dict:
    path = os.path.join(directory, INDEX)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"fastbert: prepared data directory {directory} does not exist (make one with `fastbert prepare`)"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"fastbert: {directory} has no {INDEX}: it is not a prepared data directory, or its preparation did "
            "not finish (run `fastbert prepare` again)"
        )
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except ValueError as e:
        raise ValueError(f"fastbert: {path} is not valid JSON ({e})") from None
    if index.get("format") != FORMAT:
        raise ValueError(f"fastbert: {path} is not a fastbert pretraining data index (format {index.get('format')!r})")
    if index.get("version") != VERSION:
        raise ValueError(f"fastbert: {path} has version {index.get('version')}; this fastbert reads version {VERSION}")
    return index


class InstanceDataset:
    """The instances of one split of a prepared directory, read through memory maps.

    ds[i] -> (input_ids int64 numpy array, segment_a_length, next_sentence_label)."""

    def __init__(self, directory: str, split: str = "train"):
        self.directory = directory
        self.index = read_index(directory)
        splits = self.index.get("splits", {})
        if split not in splits:
            raise ValueError(f"fastbert: {directory} has no {split!r} split (it has {sorted(splits)})")
        self.split = split
        self.meta = splits[split]
        self._shards: List[Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]] = [None] * len(self.meta["shards"])
        self._starts = [0]
        for s in self.meta["shards"]:
            self._starts.append(self._starts[-1] + int(s["instances"]))
        for k in range(len(self._shards)):  # open (and check) every shard now: a damaged one is named up front
            self._shard(k)

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def max_seq_length(self) -> int:
        return int(self.index["max_seq_length"])

    def _shard(self, k: int):
        shard = self._shards[k]
        if shard is None:
            meta = self.meta["shards"][k]
            base = os.path.join(self.directory, meta["prefix"])
            try:
                ids = np.load(base + ".ids.npy", mmap_mode="r")
                offsets = np.load(base + ".offsets.npy", mmap_mode="r")
                info = np.load(base + ".info.npy", mmap_mode="r")
            except (OSError, ValueError) as e:
                raise ValueError(f"fastbert: shard {base} is missing or damaged ({e}); prepare the data again") from None
            n = int(meta["instances"])
            if (offsets.shape != (n + 1,) or info.shape != (n, 2) or ids.shape != (int(meta["tokens"]),)
                    or int(offsets[-1]) != ids.shape[0]):
                raise ValueError(
                    f"fastbert: shard {base} does not match {INDEX} ({n} instances, {meta['tokens']} tokens expected); "
                    "prepare the data again"
                )
            shard = self._shards[k] = (ids, offsets, info)
        return shard

    def locate(self, i: int) -> Tuple[int, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"instance {i} out of range [0, {len(self)})")
        k = bisect.bisect_right(self._starts, i) - 1
        return k, i - self._starts[k]

    def __getitem__(self, i: int) -> Tuple[np.ndarray, int, int]:
        k, j = self.locate(int(i))
        ids, offsets, info = self._shard(k)
        row = np.asarray(ids[offsets[j]:offsets[j + 1]], np.int64)
        return row, int(info[j, 0]), int(info[j, 1])

    def lengths(self) -> np.ndarray:
        """int64 [len(self)]: every instance's length."""
        lengths = [np.diff(np.asarray(self._shard(k)[1])) for k in range(len(self._shards))]
        return np.concatenate(lengths or [np.zeros(0, np.int64)])


def special_ids(index: dict) -> Dict[str, int]:
    return {k: int(v) for k, v in index["special_tokens"].items()}
