"""BERT pretraining (MLM + NSP) on fastbert's fused ops: raw text to a trained BertForPreTraining.

    corpus.py          text files -> documents of sentences (two layouts; bad lines counted and skipped)
    default_corpus.py  the built-in corpus: the standard library's pydoc_data.topics
    vocab.py           WordPiece vocabularies with `tokenizers`: train one, or load vocab.txt / tokenizer.json
    instances.py       sentence pairs after BERT's create_pretraining_data recipe
    shards.py          pairs on disk: memory-mapped numpy shards and an index
    prepare.py         `fastbert prepare`: all of the above
    batches.py         which pairs each process reads at each step; masking (fastbert.masking, C++)
    checkpoint.py      atomic, verified checkpoints
    trainer.py         the loop: AdamW, warm-up + linear decay, clipping, accumulation, autocast, DDP, logs, curves
    pretrain.py        `fastbert pretrain`

Command line: `fastbert prepare --help`, `fastbert pretrain --help`.
"""
from fastbert.data.prepare import prepare_data
from fastbert.pretraining.trainer import TrainConfig, Trainer, TrainResult, train

__all__ = ["prepare_data", "TrainConfig", "TrainResult", "Trainer", "train"]
