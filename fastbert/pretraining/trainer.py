"""The pretraining loop: BertForPreTraining on fastbert's fused ops, MLM + NSP.

    loss = mean cross-entropy over the masked tokens (MLM) + mean cross-entropy of the
           next-sentence label (NSP)

exactly transformers' BertForPreTraining loss; the MLM head runs on the masked tokens only (the
loss is the same, the vocabulary projection of the other ~85% of the tokens is skipped).

AdamW (beta1 0.9, beta2 0.999, eps 1e-6, weight decay 0.01 except on biases and LayerNorm weights),
linear warm-up then linear decay to zero, gradient clipping, gradient accumulation, bf16 / fp16
autocast (fp16 with a gradient scaler). Masks are drawn per batch (fastbert.masking, C++).

Multi-process data parallel under torchrun (DistributedDataParallel; gloo on CPU, nccl on GPU):
every process reads its own block of each global batch (see batches.py).

Checkpoints (checkpoint.py) hold the model, optimizer, scheduler, scaler, step, data position and
every process's RNG states, so a resumed run continues exactly as one that never stopped. SIGINT and
SIGTERM finish the current step, write a checkpoint and stop.

Output directory:
    config.json, model.safetensors, tokenizer files   the model (loads with from_pretrained, fastbert's or transformers')
    checkpoints/step-<n>.pt, checkpoints.json         training state, for --resume
    log.jsonl                                          one JSON object per log window and per evaluation
    curves.png                                         loss and accuracy curves (when matplotlib is installed)
    run.json                                           the run's settings
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from fastbert.data.shards import INDEX, InstanceDataset
from fastbert.model import BertConfig, BertForPreTraining
from fastbert.pretraining import checkpoint as ckpt
from fastbert.pretraining.batches import BatchPlan, EvalPlan, make_collator

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
# stats: MLM loss sum, MLM correct, MLM count, NSP loss sum, NSP correct, NSP count, real tokens
_NSTATS = 7


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


# --------------------------------------------------------------------------------------------
# processes


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: Optional[str] = None) -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR / PORT),
    or run alone. gloo for CPU, nccl for CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local_rank)
    elif torch.cuda.is_available():
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(minutes=30))
        owns = True
    if world > 1 and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    if dev.type == "cpu" and local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return DistInfo(rank, world, local_rank, local_world, dev, owns)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


# --------------------------------------------------------------------------------------------
# the objective


class PretrainingObjective(nn.Module):
    """BertForPreTraining's loss, with the MLM head on the masked tokens only.

    forward(input_ids, attention_mask, token_type_ids, labels, next_sentence_label)
        -> (loss, stats float64 [7]: MLM loss sum, MLM correct, MLM count, NSP loss sum, NSP correct,
            NSP count, real tokens)"""

    def __init__(self, model: BertForPreTraining):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label):
        out = self.model.bert(input_ids, attention_mask, token_type_ids)
        hidden = out.last_hidden_state
        flat_labels = labels.reshape(-1)
        sel = (flat_labels != -100).nonzero().squeeze(1)
        targets = flat_labels.index_select(0, sel)
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, sel)
        mlm_logits = self.model.cls.predictions(picked).float()
        nsp_logits = self.model.cls.seq_relationship(out.pooler_output).float()
        if targets.numel():
            mlm_sum = F.cross_entropy(mlm_logits, targets, reduction="sum")
            mlm_loss = mlm_sum / targets.numel()
        else:
            mlm_sum = mlm_loss = mlm_logits.sum() * 0.0
        nsp_sum = F.cross_entropy(nsp_logits, next_sentence_label, reduction="sum")
        nsp_loss = nsp_sum / next_sentence_label.numel()
        loss = mlm_loss + nsp_loss
        with torch.no_grad():
            stats = torch.stack([
                mlm_sum.detach().double(),
                (mlm_logits.argmax(-1) == targets).sum().double(),
                torch.tensor(float(targets.numel()), dtype=torch.float64, device=loss.device),
                nsp_sum.detach().double(),
                (nsp_logits.argmax(-1) == next_sentence_label).sum().double(),
                torch.tensor(float(next_sentence_label.numel()), dtype=torch.float64, device=loss.device),
                attention_mask.sum().double(),
            ])
        return loss, stats


def cast_embeddings_under_autocast(model: BertForPreTraining, device_type: str) -> None:
    """Under autocast the embeddings' output (LayerNorm, float32) is the residual of the first
    layer's add_layer_norm, whose other input comes out of an autocast GEMM in bf16 / fp16; the op
    wants one dtype. Cast the embeddings' output to the autocast dtype, as the GEMMs that read it
    would."""
    def hook(module, args, output):
        if torch.is_autocast_enabled(device_type):
            return output.to(torch.get_autocast_dtype(device_type))
        return output

    model.bert.embeddings.register_forward_hook(hook)


def summarize(stats: torch.Tensor) -> Dict[str, float]:
    s = stats.tolist()
    mlm_n, nsp_n = max(s[2], 1.0), max(s[5], 1.0)
    mlm_loss, nsp_loss = s[0] / mlm_n, s[3] / nsp_n
    return {
        "loss": mlm_loss + nsp_loss,
        "mlm_loss": mlm_loss,
        "mlm_acc": s[1] / mlm_n,
        "mlm_perplexity": math.exp(min(mlm_loss, 50.0)),
        "nsp_loss": nsp_loss,
        "nsp_acc": s[4] / nsp_n,
        "masked_tokens": int(s[2]),
        "pairs": int(s[5]),
    }


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Weight decay on the weights of linear and embedding layers; none on biases and LayerNorm."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def linear_schedule(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """lr factor after `s` optimizer steps: (s + 1) / warmup during warm-up, then linear to 0 at total."""
    def factor(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        return max(0.0, (total_steps - s) / max(1, total_steps - warmup_steps))
    return factor


# --------------------------------------------------------------------------------------------
# signals


class _StopRequest:
    """SIGINT / SIGTERM set a flag the loop reads after each step; a second SIGINT stops at once."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {}

    def _handler(self, signum, frame):
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        return False


# --------------------------------------------------------------------------------------------
# the run


class _Logger:
    def __init__(self, path: str, enabled: bool, keep_until: Optional[int]):
        self.path = path
        self.enabled = enabled
        if not enabled:
            return
        kept: List[str] = []
        if keep_until is not None and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a kill
                    if rec.get("step", 0) <= keep_until:
                        kept.append(json.dumps(rec))
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in kept)

    def write(self, record: Dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def records(self) -> List[Dict[str, Any]]:
        if not os.path.isfile(self.path):
            return []
        out = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out


def _fingerprint(data_dir: str) -> str:
    with open(os.path.join(data_dir, INDEX), "rb") as f:
        index = json.load(f)
    index.pop("summary", None)  # timings
    index.get("settings", {}).pop("corpus", None)  # where the text was read from
    return hashlib.sha256(json.dumps(index, sort_keys=True).encode()).hexdigest()[:16]


def build_model_config(cfg: TrainConfig, index: dict) -> BertConfig:
    special = index["special_tokens"]
    if cfg.init_from:
        config = BertConfig.from_pretrained(cfg.init_from)
    elif cfg.model_config:
        config = BertConfig.from_pretrained(cfg.model_config)
    else:
        config = BertConfig(
            vocab_size=int(index["vocab_size"]), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=2,
            hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
            pad_token_id=int(special["[PAD]"]),
        )
    if config.vocab_size != int(index["vocab_size"]):
        raise TrainError(
            f"the model's vocab_size {config.vocab_size} differs from the data's vocabulary ({index['vocab_size']} tokens); "
            "prepare the data with the model's vocabulary (--vocab)"
        )
    if int(index["max_seq_length"]) > config.max_position_embeddings:
        raise TrainError(
            f"max_seq_length {index['max_seq_length']} is larger than the model's max_position_embeddings "
            f"{config.max_position_embeddings}: positions past it have no embedding. Use --max-seq-length <= "
            f"{config.max_position_embeddings} or a larger --max-position-embeddings"
        )
    if config.type_vocab_size < 2:
        raise TrainError(f"the model's type_vocab_size is {config.type_vocab_size}; sentence pairs need 2")
    return config


def _check_config(cfg: TrainConfig) -> None:
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


class Trainer:
    def __init__(self, cfg: TrainConfig, info: Optional[DistInfo] = None, *, print_fn: Callable[[str], None] = print,
                 on_step: Optional[Callable[["Trainer", int, float], None]] = None):
        _check_config(cfg)
        self.cfg = cfg
        self.info = info or init_distributed(cfg.device)
        self.print = print_fn if self.info.is_main else (lambda *a, **k: None)
        self.on_step = on_step
        self.device = self.info.device
        self.ckpt_dir = os.path.join(cfg.out_dir, "checkpoints")

        # ---- data
        try:
            self.train_data = InstanceDataset(cfg.data_dir, "train")
        except (FileNotFoundError, ValueError) as e:
            raise TrainError(str(e)) from None
        self.index = self.train_data.index
        self.eval_data = InstanceDataset(cfg.data_dir, "eval") if "eval" in self.index["splits"] else None
        vocab_tokens = None
        if cfg.whole_word_mask:
            with open(os.path.join(cfg.data_dir, "vocab.txt"), encoding="utf-8") as f:
                vocab_tokens = [line.rstrip("\n") for line in f]
        self.collator = make_collator(self.index, mlm_probability=cfg.mlm_probability,
                                      whole_word_mask=cfg.whole_word_mask, max_predictions=cfg.max_predictions,
                                      vocab_tokens=vocab_tokens)
        self.eval_collator = make_collator(self.index, mlm_probability=cfg.mlm_probability,
                                           whole_word_mask=cfg.whole_word_mask, max_predictions=cfg.max_predictions,
                                           vocab_tokens=vocab_tokens)
        self.plan = BatchPlan(self.train_data, self.collator, batch_size=cfg.batch_size, seed=cfg.seed,
                              rank=self.info.rank, world_size=self.info.world_size)
        self.eval_plan = (EvalPlan(self.eval_data, self.eval_collator, batch_size=cfg.eval_batch_size, seed=cfg.seed,
                                   max_batches=cfg.eval_max_batches) if self.eval_data is not None and len(self.eval_data) else None)
        if cfg.max_steps is not None:
            self.total_steps = int(cfg.max_steps)
        else:
            self.total_steps = max(1, math.ceil(cfg.epochs * self.plan.per_epoch / cfg.grad_accum))
        self.warmup_steps = int(round(cfg.warmup * self.total_steps)) if cfg.warmup < 1 else int(cfg.warmup)

        # ---- model (the same initial weights in every process)
        self.model_config = build_model_config(cfg, self.index)
        torch.manual_seed(cfg.seed)
        if cfg.init_from:
            self.model = BertForPreTraining.from_pretrained(cfg.init_from)
        else:
            self.model = BertForPreTraining(self.model_config)
        self.model.set_backend(cfg.backend)
        self.model.to(self.device).train()
        if cfg.precision != "fp32":
            cast_embeddings_under_autocast(self.model, self.device.type)
        self.objective = PretrainingObjective(self.model)
        if self.info.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DDP(self.objective, device_ids=ids, broadcast_buffers=False)
        else:
            self.ddp = None
        # dropout streams differ between processes
        torch.manual_seed(cfg.seed * 1000003 + 7919 * (self.info.rank + 1))

        # foreach, not fused: the fused kernel updates parameters without bumping their version
        # counters, and the model's inference caches (the concatenated QKV weight) key on them
        self.optimizer = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, foreach=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, linear_schedule(self.warmup_steps, self.total_steps))
        self.amp_dtype = PRECISIONS[cfg.precision]
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.precision == "fp16" else None

        self.step = 0
        self.consumed = 0  # micro-batches read since the start of training
        self.first_eval: Optional[Dict[str, float]] = None
        self.last_eval: Optional[Dict[str, float]] = None
        self.fingerprint = _fingerprint(cfg.data_dir)
        self.resumed_from: Optional[str] = None

    # ---- pieces

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _to_device(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        if self.device.type == "cpu":
            return batch
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.info.distributed:
            t = t.to(self.device)
            dist.all_reduce(t)
        return t.cpu()

    @torch.no_grad()
    def evaluate(self) -> Optional[Dict[str, float]]:
        """Held-out MLM loss / accuracy and NSP loss / accuracy with fixed masks (every process
        evaluates its share of the batches; the sums are added up)."""
        if self.eval_plan is None:
            return None
        self.model.eval()
        sums = torch.zeros(_NSTATS, dtype=torch.float64, device=self.device)
        for b in range(self.info.rank, self.eval_plan.num_batches, self.info.world_size):
            batch = self._to_device(self.eval_plan.batch(b))
            with self._autocast():
                _, stats = self.objective(**batch)
            sums += stats
        self.model.train()
        return summarize(self._all_reduce(sums))

    def run_state(self) -> Dict[str, Any]:
        d = self.cfg.to_dict()
        return {k: v for k, v in d.items() if k not in TrainConfig.RESUMABLE_CHANGES} | {
            "world_size": self.info.world_size, "data": self.fingerprint}

    def save(self, log_record: Optional[Dict[str, Any]] = None) -> Optional[str]:
        """Checkpoint (every process's RNG state gathered into it) + the model in the output directory."""
        rng = ckpt.rng_state()
        if self.info.distributed:
            states: List[Any] = [None] * self.info.world_size
            dist.all_gather_object(states, rng)
        else:
            states = [rng]
        path = None
        if self.info.is_main:
            state = {
                "step": self.step,
                "consumed": self.consumed,
                "epoch": self.plan.position(self.consumed)[0],
                "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": states,
                "run": self.run_state(),
                "model_config": self.model_config.to_dict(),
                "first_eval": self.first_eval,
                "last_eval": self.last_eval,
                "total_steps": self.total_steps,
            }
            path = ckpt.save_checkpoint(self.ckpt_dir, state, keep=self.cfg.keep_checkpoints)
            self.save_model()
        barrier(self.info)
        return path

    def save_model(self) -> None:
        self.model.save_pretrained(self.cfg.out_dir)
        for name in TOKENIZER_FILES:
            src = os.path.join(self.cfg.data_dir, name)
            if os.path.isfile(src) and os.path.abspath(src) != os.path.abspath(os.path.join(self.cfg.out_dir, name)):
                shutil.copyfile(src, os.path.join(self.cfg.out_dir, name))

    def _resolve_resume(self) -> Optional[str]:
        r = self.cfg.resume
        if r is None:
            if not self.cfg.overwrite and os.path.isdir(self.ckpt_dir) and ckpt.read_manifest(self.ckpt_dir):
                raise TrainError(
                    f"{self.cfg.out_dir} holds checkpoints of an earlier run; pass --resume to continue it or "
                    "--overwrite to start over"
                )
            return None
        if r == "auto":
            try:
                path = ckpt.find_latest(self.ckpt_dir)
            except ckpt.CheckpointError as e:
                raise TrainError(f"cannot resume: {e}") from None
            if path is None:
                raise TrainError(f"cannot resume: no checkpoint in {self.ckpt_dir} (nothing was saved there)")
            return path
        if os.path.isdir(r):
            sub = os.path.join(r, "checkpoints")
            try:
                path = ckpt.find_latest(sub if os.path.isdir(sub) else r)
            except ckpt.CheckpointError as e:
                raise TrainError(f"cannot resume: {e}") from None
            if path is None:
                raise TrainError(f"cannot resume: no checkpoint in {r}")
            return path
        return r

    def restore(self, path: str) -> None:
        try:
            state = ckpt.load_checkpoint(path)
        except ckpt.CheckpointError as e:
            raise TrainError(f"cannot resume: {e}") from None
        saved, now = state["run"], self.run_state()
        diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        if diff:
            detail = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in diff)
            raise TrainError(f"cannot resume from {path}: the run's settings differ ({detail})")
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise TrainError(f"cannot resume: checkpoint {path} does not fit this model ({e})") from None
        self.step = int(state["step"])
        self.consumed = int(state["consumed"])
        self.first_eval = state.get("first_eval")
        self.last_eval = state.get("last_eval")
        rng = state["rng"]
        if len(rng) != self.info.world_size:
            raise TrainError(f"cannot resume: checkpoint {path} was written by {len(rng)} processes, this run has "
                             f"{self.info.world_size}")
        ckpt.set_rng_state(rng[self.info.rank])
        self.resumed_from = path

    # ---- the loop

    def train(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        t_start = time.perf_counter()
        if info.is_main:
            os.makedirs(cfg.out_dir, exist_ok=True)
        barrier(info)
        path = self._resolve_resume()
        if path is not None:
            self.restore(path)
        elif cfg.overwrite and info.is_main and os.path.isdir(self.ckpt_dir):
            shutil.rmtree(self.ckpt_dir)
        barrier(info)
        logger = _Logger(os.path.join(cfg.out_dir, "log.jsonl"), info.is_main, self.step if path else None)
        if info.is_main:
            with open(os.path.join(cfg.out_dir, "run.json"), "w", encoding="utf-8") as f:
                json.dump({"train": cfg.to_dict(), "world_size": info.world_size, "total_steps": self.total_steps,
                           "warmup_steps": self.warmup_steps, "model": self.model_config.to_dict(),
                           "data": self.fingerprint}, f, indent=2)
        self._announce()
        result = TrainResult(step=self.step, total_steps=self.total_steps, out_dir=cfg.out_dir)

        started = cfg.started if cfg.started is not None else time.time()
        t_eval = time.perf_counter()
        if path is None:
            self.first_eval = self.evaluate()
            if self.first_eval is not None:
                logger.write({"type": "eval", "step": 0, **self.first_eval})
                self.print(f"held-out at step 0: {_eval_line(self.first_eval)}")
        else:
            self.print(f"resumed from {path} at step {self.step}")
        eval_s = time.perf_counter() - t_eval if path is None else 0.0  # the slowest evaluation so far
        step_s = 0.0

        bar = None
        if cfg.progress and info.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, desc="pretrain", unit="step", dynamic_ncols=True)

        window = torch.zeros(_NSTATS, dtype=torch.float64, device=self.device)
        window_loss, window_steps, window_t0 = 0.0, 0, time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        module = self.ddp if self.ddp is not None else self.objective
        stop = _StopRequest()
        last_saved = self.step if path else -1
        with stop:
            while self.step < self.total_steps:
                t_step = time.perf_counter()
                step_loss = torch.zeros((), dtype=torch.float64, device=self.device)
                for micro in range(cfg.grad_accum):
                    batch = self._to_device(self.plan.batch(self.consumed))
                    self.consumed += 1
                    sync = self.ddp is None or micro == cfg.grad_accum - 1
                    with (contextlib.nullcontext() if sync else self.ddp.no_sync()):
                        with self._autocast():
                            loss, stats = module(**batch)
                        scaled = loss / cfg.grad_accum
                        if self.scaler is not None:
                            scaled = self.scaler.scale(scaled)
                        scaled.backward()
                    window += stats
                    step_loss += loss.detach().double()
                if self.scaler is not None:
                    self.scaler.unscale_(self.optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                lr = self.scheduler.get_last_lr()[0]
                self.scheduler.step()
                self.step += 1
                step_loss = self._all_reduce(step_loss / cfg.grad_accum).item() / info.world_size
                result.losses.append(step_loss)
                step_s = max(step_s, time.perf_counter() - t_step)  # the slowest step so far
                window_loss += step_loss
                window_steps += 1
                if bar is not None:
                    bar.update(1)

                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    sums = self._all_reduce(window)
                    dt = time.perf_counter() - window_t0
                    m = summarize(sums)
                    rec = {"type": "train", "step": self.step, "epoch": round(self.consumed / self.plan.per_epoch, 4),
                           "loss": window_loss / window_steps, "mlm_loss": m["mlm_loss"], "nsp_loss": m["nsp_loss"],
                           "mlm_acc": m["mlm_acc"], "nsp_acc": m["nsp_acc"], "lr": lr,
                           "grad_norm": float(grad_norm), "tokens_per_s": float(sums[6]) / max(dt, 1e-9),
                           "elapsed_s": round(time.perf_counter() - t_start, 2)}
                    logger.write(rec)
                    if bar is not None:
                        bar.set_postfix(loss=f"{rec['loss']:.3f}", mlm_acc=f"{m['mlm_acc']:.3f}",
                                        nsp_acc=f"{m['nsp_acc']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)
                    elif info.is_main:
                        self.print(f"step {self.step}/{self.total_steps}  loss {rec['loss']:.4f}  mlm_acc {m['mlm_acc']:.3f}  "
                                   f"nsp_acc {m['nsp_acc']:.3f}  lr {lr:.2e}  {rec['tokens_per_s']:.0f} tok/s")
                    window.zero_()
                    window_loss, window_steps, window_t0 = 0.0, 0, time.perf_counter()

                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
                    t_eval = time.perf_counter()
                    ev = self.evaluate()
                    eval_s = max(eval_s, time.perf_counter() - t_eval)
                    if ev is not None:
                        self.last_eval = ev
                        logger.write({"type": "eval", "step": self.step, **ev})
                        line = f"held-out at step {self.step}: {_eval_line(ev)}"
                        if bar is not None:
                            bar.write(line)
                        else:
                            self.print(line)
                    window_t0 = time.perf_counter()

                if self.on_step is not None:
                    self.on_step(self, self.step, step_loss)

                out_of_time = (cfg.time_limit is not None
                               and time.time() - started + 1.5 * eval_s + 2 * step_s + 15.0 > cfg.time_limit)
                flag = 1.0 if (stop.signum is not None or (cfg.stop_after is not None and self.step >= cfg.stop_after)) else 0.0
                flag = max(flag, 2.0 if out_of_time else 0.0)
                if info.distributed:
                    t = torch.tensor([flag], device=self.device)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    flag = float(t.item())
                if flag and self.step < self.total_steps:
                    if flag == 2.0 and stop.signum is None:
                        result.time_limited = True
                    else:
                        result.interrupted = True
                        result.signal = stop.signum
                    break
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < self.total_steps:
                    result.checkpoint = self.save()
                    last_saved = self.step
                    if cfg.plot and info.is_main:
                        plot_curves(logger.path, os.path.join(cfg.out_dir, "curves.png"), quiet=True)
                    window_t0 = time.perf_counter()
        if bar is not None:
            bar.close()

        self._check_replicas()
        if not result.interrupted:
            ev = self.evaluate()
            if ev is not None:
                self.last_eval = ev
                logger.write({"type": "eval", "step": self.step, **ev})
        if self.step != last_saved:
            result.checkpoint = self.save()
        if cfg.plot and info.is_main:
            plot_curves(logger.path, os.path.join(cfg.out_dir, "curves.png"))
        result.step = self.step
        result.first_eval, result.last_eval = self.first_eval, self.last_eval
        result.seconds = time.perf_counter() - t_start
        if result.time_limited:
            self.print(f"stopped early at step {self.step}/{self.total_steps}: the time limit ({cfg.time_limit:.0f} s) "
                       f"was near; checkpoint {result.checkpoint}; continue with --resume")
        if result.interrupted:
            why = f"signal {signal.Signals(result.signal).name}" if result.signal else f"--stop-after {cfg.stop_after}"
            self.print(f"stopped at step {self.step}/{self.total_steps} ({why}); checkpoint {result.checkpoint}; "
                       "continue with --resume")
        return result

    def _check_replicas(self) -> None:
        """Every process must hold the same weights (DDP averages the gradients); a checksum per
        process, compared, catches a process that drifted."""
        if not self.info.distributed:
            return
        with torch.no_grad():
            mine = torch.stack([p.detach().double().sum() for p in self.model.parameters()]).sum().reshape(1)
        sums = [torch.zeros_like(mine, device=self.device) for _ in range(self.info.world_size)]
        dist.all_gather(sums, mine.to(self.device))
        values = [float(x) for x in sums]
        if max(values) != min(values):
            self.print(f"warning: the model replicas differ between processes (weight checksums {values})")

    def _announce(self) -> None:
        cfg, info = self.cfg, self.info
        n_params = sum(p.numel() for p in self.model.parameters())
        mc = self.model_config
        from fastbert.backend import resolve

        backend = resolve(cfg.backend, next(self.model.parameters()))
        self.print(
            f"model: BertForPreTraining, {mc.num_hidden_layers} layers, hidden {mc.hidden_size}, {mc.num_attention_heads} "
            f"heads, intermediate {mc.intermediate_size}, vocab {mc.vocab_size}: {n_params / 1e6:.2f} M parameters; "
            f"fastbert backend {backend!r} on {self.device}, {cfg.precision}"
        )
        ev = f", held-out {len(self.eval_data)} pairs" if self.eval_data is not None else ", no held-out split"
        self.print(
            f"data: {cfg.data_dir}: {len(self.train_data)} training pairs (max_seq_length {self.index['max_seq_length']}){ev}"
        )
        self.print(
            f"training: {self.total_steps} steps of {cfg.batch_size * cfg.grad_accum * info.world_size} pairs "
            f"({info.world_size} process(es) x batch {cfg.batch_size} x accumulation {cfg.grad_accum}), "
            f"{self.plan.per_epoch // cfg.grad_accum if cfg.grad_accum <= self.plan.per_epoch else 0} steps per epoch, "
            f"lr {cfg.lr:g}, warm-up {self.warmup_steps} steps, {torch.get_num_threads()} thread(s) per process"
        )

    def close(self) -> None:
        if self.info.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _eval_line(m: Dict[str, float]) -> str:
    return (f"MLM loss {m['mlm_loss']:.3f}, MLM accuracy {m['mlm_acc']:.3f}, NSP loss {m['nsp_loss']:.3f}, "
            f"NSP accuracy {m['nsp_acc']:.3f} ({m['pairs']} pairs, {m['masked_tokens']} masked tokens)")


def format_eval_table(first: Optional[Dict[str, float]], last: Optional[Dict[str, float]], step: int) -> str:
    if first is None or last is None:
        return "no held-out evaluation (the data has no held-out split)"
    rows = [("MLM loss", "mlm_loss", "{:.3f}"), ("MLM perplexity", "mlm_perplexity", "{:.1f}"),
            ("MLM accuracy", "mlm_acc", "{:.1%}"), ("NSP loss", "nsp_loss", "{:.3f}"),
            ("NSP accuracy", "nsp_acc", "{:.1%}")]
    head = f"held-out ({last['pairs']} pairs, {last['masked_tokens']} masked tokens, fixed masks)"
    lines = [head, f"  {'':<16}{'start (step 0)':>16}{f'end (step {step})':>18}"]
    for label, key, fmt in rows:
        lines.append(f"  {label:<16}{fmt.format(first[key]):>16}{fmt.format(last[key]):>18}")
    return "\n".join(lines)


def plot_curves(log_path: str, png_path: str, quiet: bool = False) -> bool:
    """Loss, accuracy and learning-rate curves from log.jsonl; False (with a message unless quiet)
    when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not quiet:
            print("curves not drawn: matplotlib is not installed (pip install matplotlib)")
        return False
    recs = _Logger(log_path, False, None).records()
    train = [r for r in recs if r.get("type") == "train"]
    ev = [r for r in recs if r.get("type") == "eval"]
    if not train and not ev:
        return False
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    ax = axes[0]
    if train:
        ax.plot([r["step"] for r in train], [r["mlm_loss"] for r in train], label="MLM (train)")
        ax.plot([r["step"] for r in train], [r["nsp_loss"] for r in train], label="NSP (train)")
    if ev:
        ax.plot([r["step"] for r in ev], [r["mlm_loss"] for r in ev], "o--", label="MLM (held-out)")
        ax.plot([r["step"] for r in ev], [r["nsp_loss"] for r in ev], "s--", label="NSP (held-out)")
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.legend()
    for ax, key, title in ((axes[1], "mlm_acc", "MLM accuracy"), (axes[2], "nsp_acc", "NSP accuracy")):
        if train:
            ax.plot([r["step"] for r in train], [r[key] for r in train], label="train")
        if ev:
            ax.plot([r["step"] for r in ev], [r[key] for r in ev], "o--", label="held-out")
        if key == "nsp_acc":
            ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    if train:
        axes[3].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[3].set_title("learning rate")
    axes[3].set_xlabel("step")
    fig.tight_layout()
    tmp = png_path + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, png_path)
    return True


def train(cfg: TrainConfig, info: Optional[DistInfo] = None, **kw) -> TrainResult:
    trainer = Trainer(cfg, info, **kw)
    try:
        return trainer.train()
    finally:
        if info is None:
            trainer.close()
