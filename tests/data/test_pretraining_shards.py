"""Pretraining instances on disk: the shards round-trip through ShardWriter and InstanceDataset, and
a damaged shard or a missing index is named."""
import os

import numpy as np
import pytest

from fastbert.data import pretraining_shards
from fastbert.data.pretraining_shards import InstanceDataset, ShardWriter, read_index, write_index


def test_shards_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    rows = [(rng.integers(0, 70000, int(rng.integers(5, 40))), int(rng.integers(2, 5)), int(rng.integers(0, 2)))
            for _ in range(257)]
    w = ShardWriter(str(tmp_path), "train", vocab_size=70000, shard_size=50, seed=0)
    for ids, a, lab in rows:
        w.add(ids, a, lab)
    meta = w.close()
    assert meta["instances"] == 257 and len(meta["shards"]) == 6
    write_index(str(tmp_path), {"max_seq_length": 40, "vocab_size": 70000, "special_tokens": {}, "splits": {"train": meta}})
    ds = InstanceDataset(str(tmp_path), "train")
    got = sorted((tuple(ds[i][0].tolist()), ds[i][1], ds[i][2]) for i in range(len(ds)))
    want = sorted((tuple(int(x) for x in ids), a, lab) for ids, a, lab in rows)
    assert got == want
    assert ds[0][0].dtype == np.int64
    assert sorted(ds.lengths().tolist()) == sorted(len(r[0]) for r in rows)
    assert isinstance(np.load(str(tmp_path / "train-00000.ids.npy"), mmap_mode="r"), np.memmap)
    # small vocabularies are stored as uint16
    assert pretraining_shards.token_dtype(30522) == np.uint16


def test_damaged_shard_and_missing_index_are_named(tmp_path):
    w = ShardWriter(str(tmp_path), "train", vocab_size=100, shard_size=10)
    for i in range(25):
        w.add(np.arange(5 + i % 3), 2, i % 2)
    write_index(str(tmp_path), {"max_seq_length": 8, "vocab_size": 100, "special_tokens": {}, "splits": {"train": w.close()}})
    ids = str(tmp_path / "train-00001.ids.npy")
    data = open(ids, "rb").read()
    open(ids, "wb").write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="train-00001"):
        InstanceDataset(str(tmp_path), "train")
    os.remove(str(tmp_path / "index.json"))
    with pytest.raises(FileNotFoundError, match="no index.json"):
        read_index(str(tmp_path))
