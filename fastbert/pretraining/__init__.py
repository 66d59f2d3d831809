"""BERT pretraining (MLM + NSP) on fastbert's fused ops: raw text to a trained BertForPreTraining.

    config.py          TrainConfig, TrainResult, TrainError, the model config a run builds
    objective.py       the MLM + NSP loss with the MLM head on the masked tokens only
    schedule.py        AdamW parameter groups, warm-up + linear decay
    distributed.py     the process group, collectives, the replica check, stop signals
    batches.py         which pairs each process reads at each step; masking (fastbert.masking, C++)
    checkpoint.py      the checkpoint file: written atomically, verified on load; the manifest; RNG states
    logs.py            log.jsonl, the held-out table, curves.png
    trainer.py         the loop: accumulation, clipping, autocast, DDP, evaluation, the time limit;
                       what a run saves, where it resumes from, and how it restores

The data it reads is made by fastbert.data (corpus, vocab, instances, shards, `fastbert prepare`).

Command line (fastbert.commands.prepare and .pretrain): `fastbert prepare --help`, `fastbert pretrain --help`.
"""
from fastbert.data.prepare import prepare_data
from fastbert.pretraining.trainer import TrainConfig, Trainer, TrainResult, train

__all__ = ["prepare_data", "TrainConfig", "TrainResult", "Trainer", "train"]
