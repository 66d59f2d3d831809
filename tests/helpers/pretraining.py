"""Helpers of the pretraining tests: a tiny prepared data set, a tiny model config and the same
settings as `fastbert pretrain` arguments."""
import itertools
import os

from fastbert.data import default_corpus
from fastbert.data.prepare import prepare_data
from fastbert.pretraining.config import TrainConfig


def small_documents(n=60):
    """The first n documents of the built-in corpus (English prose)."""
    return lambda: itertools.islice(default_corpus.documents(), n)


def make_tiny_data(out):
    """A prepared directory: 60 documents, a 400-token vocabulary, pairs of at most 32 tokens."""
    prepare_data(out, documents=small_documents(), vocab_size=400, max_seq_length=32, dupe_factor=1,
                 eval_fraction=0.1, progress=False, log=lambda *a: None)
    return out


def tiny_config(data_dir, out_dir, **kw):
    base = dict(data_dir=data_dir, out_dir=out_dir, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=64, batch_size=8, max_steps=6, lr=1e-3, warmup=0.2,
                eval_batch_size=32, eval_max_batches=2, log_every=1, save_every=0, progress=False, plot=False)
    base.update(kw)
    return TrainConfig(**base)


def write(path, data, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(data)
    return path


# a tiny model and run as `fastbert pretrain` arguments
TINY_ARGS = ["--hidden-size", "32", "--num-layers", "2", "--num-heads", "2", "--intermediate-size", "64",
             "--max-position-embeddings", "64", "--batch-size", "8", "--vocab-size", "300", "--max-seq-length", "32",
             "--eval-batch-size", "32", "--eval-max-batches", "1", "--no-progress", "--no-plot", "--eval-fraction", "0.2"]
