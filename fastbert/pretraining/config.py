"""The settings of a pretraining run (TrainConfig), its result, its errors, and the model config
it builds from them and the prepared data."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from fastbert.data.pretraining_shards import INDEX
from fastbert.dtypes import DTYPES
from fastbert.model import BertConfig, BertForPreTraining, XLMRobertaConfig, XLMRobertaForMaskedLM

# --precision: "fp32" trains in fp32, the others under autocast to that dtype
PRECISIONS = {name: (None if name == "fp32" else dtype) for name, dtype in DTYPES.items()}


@dataclass
class TrainConfig:
    data_dir: str
    out_dir: str
    # model (ignored where model_config or init_from gives them)
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 512
    dropout: float = 0.1
    model_config: Optional[str] = None  # a config.json (or a directory holding one)
    init_from: Optional[str] = None  # a pretrained model directory to start from
    # batches and schedule
    batch_size: int = 32  # per process and micro-batch
    grad_accum: int = 1
    max_steps: Optional[int] = 800
    epochs: Optional[float] = None  # instead of max_steps
    lr: float = 5e-4
    warmup: float = 0.1  # a fraction of the steps (< 1) or a number of steps (>= 1)
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    max_grad_norm: float = 1.0
    # masking
    mlm_probability: float = 0.15
    whole_word_mask: bool = False
    max_predictions: Optional[int] = None
    precision: str = "fp32"
    seed: int = 0
    backend: Optional[str] = None
    device: Optional[str] = None
    # evaluation, logging, checkpoints
    eval_every: int = 0  # 0: at the start and the end only
    eval_batch_size: int = 64
    eval_max_batches: Optional[int] = None
    log_every: int = 10
    save_every: int = 100  # 0: only at the end (and on a signal)
    keep_checkpoints: int = 2
    resume: Optional[str] = None  # "auto" (the output directory's latest) or a checkpoint path / directory
    overwrite: bool = False  # start over in an output directory that holds checkpoints
    progress: bool = True
    plot: bool = True
    stop_after: Optional[int] = None  # stop as an interruption would, after this step (checkpoint written)
    time_limit: Optional[float] = None  # seconds since `started`: stop early (final evaluation and checkpoint
    #                                      included) rather than run past it
    started: Optional[float] = None  # time.time() the limit counts from (default: when train() starts)

    # settings that may change between a run and its resumption (everything else must match)
    RESUMABLE_CHANGES = ("out_dir", "data_dir", "eval_every", "eval_batch_size", "eval_max_batches", "log_every",
                         "save_every", "keep_checkpoints", "resume", "overwrite", "progress", "plot", "stop_after",
                         "time_limit", "started",
                         "device", "backend")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TrainResult:
    step: int
    total_steps: int
    interrupted: bool = False
    signal: Optional[int] = None
    time_limited: bool = False  # stopped early by the time limit (after a final evaluation)
    first_eval: Optional[Dict[str, float]] = None
    last_eval: Optional[Dict[str, float]] = None
    losses: List[float] = field(default_factory=list)  # per optimizer step, this run only (rank-averaged)
    checkpoint: Optional[str] = None
    out_dir: str = ""
    seconds: float = 0.0


class TrainError(RuntimeError):
    """A run that cannot start: bad settings, data or checkpoint (a one-line message)."""


def check_config(cfg: TrainConfig) -> None:
    if cfg.precision not in PRECISIONS:
        raise TrainError(f"precision must be one of {sorted(PRECISIONS)}, got {cfg.precision!r}")
    for name in ("batch_size", "grad_accum", "eval_batch_size"):
        if getattr(cfg, name) < 1:
            raise TrainError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.max_steps is None and cfg.epochs is None:
        raise TrainError("give max_steps or epochs")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise TrainError(f"max_steps must be >= 1, got {cfg.max_steps}")
    if cfg.epochs is not None and cfg.epochs <= 0:
        raise TrainError(f"epochs must be > 0, got {cfg.epochs}")
    if cfg.lr <= 0 or cfg.warmup < 0:
        raise TrainError("lr must be > 0 and warmup >= 0")
    if not 0.0 <= cfg.dropout < 1.0:
        raise TrainError(f"dropout must be in [0, 1), got {cfg.dropout}")


# the data's model_type -> the class pretraining trains on it: BERT's MLM + NSP, or XLM-R's MLM
PRETRAINING_CLASSES = {"bert": BertForPreTraining, "xlm-roberta": XLMRobertaForMaskedLM}


def pretraining_class(index: dict):
    return PRETRAINING_CLASSES[index.get("model_type", "bert")]


def build_model_config(cfg: TrainConfig, index: dict) -> BertConfig:
    """The config of the model to train: the data's model type, given (init_from, model_config) or
    from cfg's sizes. XLM-R's positions count from its pad id + 1, so its table has pad + 1 more rows
    than the longest sequence it takes (max_position_embeddings 514 for 512 tokens)."""
    special = index["special_tokens"]
    config_class = pretraining_class(index).config_class
    given = cfg.init_from or cfg.model_config
    if given:
        config = config_class.from_pretrained(given)
        if config.model_type != config_class.model_type:
            raise TrainError(f"{given} describes a {config.model_type!r} model; the data was prepared for "
                             f"{config_class.model_type!r} (--model-type)")
    else:
        xlmr = config_class is XLMRobertaConfig
        offset = int(special["[PAD]"]) + 1 if xlmr else 0
        ends = dict(bos_token_id=int(special["[CLS]"]), eos_token_id=int(special["[SEP]"])) if xlmr else {}
        config = config_class(
            vocab_size=int(index["vocab_size"]), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings + offset,
            type_vocab_size=2 if index.get("next_sentence", True) else 1,
            hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
            pad_token_id=int(special["[PAD]"]), **ends,
        )
    if config.vocab_size != int(index["vocab_size"]):
        raise TrainError(
            f"the model's vocab_size {config.vocab_size} differs from the data's vocabulary ({index['vocab_size']} tokens); "
            "prepare the data with the model's vocabulary (--vocab)"
        )
    usable = config.max_position_embeddings - (config.pad_token_id + 1 if config_class is XLMRobertaConfig else 0)
    if int(index["max_seq_length"]) > usable:
        raise TrainError(
            f"max_seq_length {index['max_seq_length']} is larger than the {usable} positions the model has an "
            f"embedding for. Use --max-seq-length <= {usable} or a larger --max-position-embeddings"
        )
    if index.get("next_sentence", True) and config.type_vocab_size < 2:
        raise TrainError(f"the model's type_vocab_size is {config.type_vocab_size}; sentence pairs need 2")
    return config


def data_fingerprint(data_dir: str) -> str:
    """A short hash of the prepared data's index (what a resumed run must train on again)."""
    with open(os.path.join(data_dir, INDEX), "rb") as f:
        index = json.load(f)
    index.pop("summary", None)  # timings
    index.get("settings", {}).pop("corpus", None)  # where the text was read from
    return hashlib.sha256(json.dumps(index, sort_keys=True).encode()).hexdigest()[:16]
