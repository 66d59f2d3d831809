"""The pretraining loop on fastbert's fused ops: BertForPreTraining, MLM + NSP, or
XLMRobertaForMaskedLM, MLM alone, as the prepared data's model_type says.

    loss = mean cross-entropy over the masked tokens (MLM) [+ mean cross-entropy of the
           next-sentence label (NSP)]

exactly transformers' BertForPreTraining / ForMaskedLM loss; the MLM head runs on the masked tokens
only (the loss is the same, the vocabulary projection of the other ~85% of the tokens is skipped).

AdamW (beta1 0.9, beta2 0.999, eps 1e-6, weight decay 0.01 except on biases and LayerNorm weights),
linear warm-up then linear decay to zero, gradient clipping, gradient accumulation, bf16 / fp16
autocast (fp16 with a gradient scaler). Masks are drawn per batch (fastbert.masking, C++).

Multi-process data parallel under torchrun (DistributedDataParallel; gloo on CPU, nccl on GPU):
every process reads its own block of each global batch (see batches.py).

Checkpoints hold the model, optimizer, scheduler, scaler, step, data position and every process's
RNG states, so a resumed run continues exactly as one that never stopped; what a run saves, where it
resumes from and how it restores are the Trainer's (its checkpoints section), the file format is
checkpoint.py's. SIGINT and SIGTERM finish the current step, write a checkpoint and stop.

Output directory:
    config.json, model.safetensors, tokenizer files   the model (loads with from_pretrained, fastbert's or transformers')
    checkpoints/step-<n>.pt, checkpoints.json         training state, for --resume
    log.jsonl                                          one JSON object per log window and per evaluation
    curves.png                                         loss and accuracy curves (with the plot extra)
    run.json                                           the run's settings
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import time
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from fastbert.data import vocab as vocab_mod
from fastbert.data.pretraining_shards import InstanceDataset
from fastbert.pretraining.batches import BatchPlan, EvalPlan, make_collator
from fastbert.pretraining.checkpoint import (
    CheckpointError,
    find_latest,
    load_checkpoint,
    read_manifest,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from fastbert.pretraining.config import (
    PRECISIONS,
    TrainConfig,
    TrainError,
    TrainResult,
    build_model_config,
    check_config,
    data_fingerprint,
    pretraining_class,
)
from fastbert.pretraining.distributed import (
    DistInfo,
    StopRequest,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    check_replicas,
    init_distributed,
)
from fastbert.pretraining.logs import JsonlLog, describe_run, eval_line, plot_curves
from fastbert.pretraining.objective import NSTATS, PretrainingObjective, cast_embeddings_under_autocast, summarize
from fastbert.pretraining.schedule import linear_schedule, param_groups, warmup_steps

# the data's tokenizer files, copied beside the model so the output directory loads with from_pretrained
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


class _Window:
    """The statistics of the steps since the last log line."""

    def __init__(self, device):
        self.stats = torch.zeros(NSTATS, dtype=torch.float64, device=device)
        self.reset()

    def reset(self) -> None:
        self.stats.zero_()
        self.loss, self.steps, self.t0 = 0.0, 0, time.perf_counter()


class Trainer:
    """A pretraining run: data, model, optimizer, the loop and its checkpoints."""

    def __init__(self, cfg: TrainConfig, info: Optional[DistInfo] = None, *, print_fn: Callable[[str], None] = print,
                 on_step: Optional[Callable[["Trainer", int, float], None]] = None):
        check_config(cfg)
        self.cfg = cfg
        self.info = info or init_distributed(cfg.device)
        self.print = print_fn if self.info.is_main else (lambda *a, **k: None)
        self.on_step = on_step
        self.device = self.info.device
        self.ckpt_dir = os.path.join(cfg.out_dir, "checkpoints")
        self._build_data()
        self._build_model()
        self._build_optimizer()
        self.step = 0
        self.consumed = 0  # micro-batches read since the start of training
        self.first_eval: Optional[Dict[str, float]] = None
        self.last_eval: Optional[Dict[str, float]] = None
        self.fingerprint = data_fingerprint(cfg.data_dir)
        self.resumed_from: Optional[str] = None

    # ---- set-up

    def _build_data(self) -> None:
        cfg = self.cfg
        try:
            self.train_data = InstanceDataset(cfg.data_dir, "train")
        except (FileNotFoundError, ValueError) as e:
            raise TrainError(str(e)) from None
        self.index = self.train_data.index
        self.eval_data = InstanceDataset(cfg.data_dir, "eval") if "eval" in self.index["splits"] else None
        starts = vocab_mod.word_start_table(vocab_mod.load_tokenizer(cfg.data_dir)) if cfg.whole_word_mask else None
        masking = dict(mlm_probability=cfg.mlm_probability, whole_word_mask=cfg.whole_word_mask,
                       max_predictions=cfg.max_predictions, word_starts=starts)
        self.collator = make_collator(self.index, **masking)
        self.eval_collator = make_collator(self.index, **masking)
        self.plan = BatchPlan(self.train_data, self.collator, batch_size=cfg.batch_size, seed=cfg.seed,
                              rank=self.info.rank, world_size=self.info.world_size)
        self.eval_plan = None
        if self.eval_data is not None and len(self.eval_data):
            self.eval_plan = EvalPlan(self.eval_data, self.eval_collator, batch_size=cfg.eval_batch_size,
                                      seed=cfg.seed, max_batches=cfg.eval_max_batches)
        if cfg.max_steps is not None:
            self.total_steps = int(cfg.max_steps)
        else:
            self.total_steps = max(1, math.ceil(cfg.epochs * self.plan.per_epoch / cfg.grad_accum))
        self.warmup_steps = warmup_steps(cfg.warmup, self.total_steps)

    def _build_model(self) -> None:
        """The same initial weights in every process; dropout streams that differ between them."""
        cfg = self.cfg
        self.model_config = build_model_config(cfg, self.index)
        torch.manual_seed(cfg.seed)
        cls = pretraining_class(self.index)
        self.model = cls.from_pretrained(cfg.init_from) if cfg.init_from else cls(self.model_config)
        self.model.set_backend(cfg.backend)
        self.model.to(self.device).train()
        if cfg.precision != "fp32":
            cast_embeddings_under_autocast(self.model, self.device.type)
        self.objective = PretrainingObjective(self.model)
        self.ddp = None
        if self.info.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DDP(self.objective, device_ids=ids, broadcast_buffers=False)
        torch.manual_seed(cfg.seed * 1000003 + 7919 * (self.info.rank + 1))

    def _build_optimizer(self) -> None:
        cfg = self.cfg
        self.optimizer = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, foreach=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_schedule(self.warmup_steps, self.total_steps))
        self.amp_dtype = PRECISIONS[cfg.precision]
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.precision == "fp16" else None

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
        return all_reduce_sum(self.info, t)

    @torch.no_grad()
    def evaluate(self) -> Optional[Dict[str, float]]:
        """Held-out MLM loss / accuracy and NSP loss / accuracy with fixed masks (every process
        evaluates its share of the batches; the sums are added up)."""
        if self.eval_plan is None:
            return None
        self.model.eval()
        sums = torch.zeros(NSTATS, dtype=torch.float64, device=self.device)
        for b in range(self.info.rank, self.eval_plan.num_batches, self.info.world_size):
            batch = self._to_device(self.eval_plan.batch(b))
            with self._autocast():
                _, stats = self.objective(**batch)
            sums += stats
        self.model.train()
        return summarize(self._all_reduce(sums))

    # ---- the loop

    def train(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        t_start = time.perf_counter()
        path = self._start()
        if path is not None and self.step >= self.total_steps and self._in_output(path):
            return self._already_finished(path)
        logger = JsonlLog(os.path.join(cfg.out_dir, "log.jsonl"), info.is_main, self.step if path else None)
        self._write_run_json()
        self._announce()
        result = TrainResult(step=self.step, total_steps=self.total_steps, out_dir=cfg.out_dir)
        started = cfg.started if cfg.started is not None else time.time()
        self._first_evaluation(path, logger)
        bar = None
        if cfg.progress and info.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, desc="pretrain", unit="step", dynamic_ncols=True)
        last_saved = self._loop(result, logger, bar, t_start, started, self.step if path else -1)
        if bar is not None:
            bar.close()
        self._finish(result, logger, last_saved, t_start)
        return result

    def _start(self) -> Optional[str]:
        """The output directory made, the run resumed (its checkpoint's path) or started over (None)."""
        cfg, info = self.cfg, self.info
        if info.is_main:
            os.makedirs(cfg.out_dir, exist_ok=True)
        barrier(info)
        path = self._resolve_resume()
        if path is not None:
            self.restore(path)
        elif cfg.overwrite and info.is_main and os.path.isdir(self.ckpt_dir):
            shutil.rmtree(self.ckpt_dir)
        barrier(info)
        return path

    def _in_output(self, path: str) -> bool:
        return os.path.dirname(os.path.abspath(path)) == os.path.abspath(self.ckpt_dir)

    def _already_finished(self, path: str) -> TrainResult:
        """The output directory holds the last step of this run: nothing to train, nothing written
        (a scheduler's retry after a kill that landed after the last checkpoint, a pipeline run again)."""
        self.print(f"{self.cfg.out_dir} already holds the finished run (step {self.step} of {self.total_steps}); "
                   "nothing to do (--overwrite starts over)")
        return TrainResult(step=self.step, total_steps=self.total_steps, first_eval=self.first_eval,
                           last_eval=self.last_eval, checkpoint=path, out_dir=self.cfg.out_dir)

    def _write_run_json(self) -> None:
        if self.info.is_main:
            with open(os.path.join(self.cfg.out_dir, "run.json"), "w", encoding="utf-8") as f:
                json.dump({"train": self.cfg.to_dict(), "world_size": self.info.world_size,
                           "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                           "model": self.model_config.to_dict(), "data": self.fingerprint}, f, indent=2)

    def _first_evaluation(self, resumed_from: Optional[str], logger: JsonlLog) -> None:
        """The held-out figures at step 0 (not on a resumed run); the slowest evaluation and step so
        far start the time limit's estimate."""
        self._slowest_eval, self._slowest_step = 0.0, 0.0
        if resumed_from is not None:
            self.print(f"resumed from {resumed_from} at step {self.step}")
            return
        t_eval = time.perf_counter()
        self.first_eval = self.evaluate()
        if self.first_eval is not None:
            logger.write({"type": "eval", "step": 0, **self.first_eval})
            self.print(f"held-out at step 0: {eval_line(self.first_eval)}")
        self._slowest_eval = time.perf_counter() - t_eval

    def _loop(self, result: TrainResult, logger: JsonlLog, bar, t_start: float, started: float,
              last_saved: int) -> int:
        """Optimizer steps until the end, a stop signal, --stop-after or the time limit; returns the
        step of the last checkpoint written."""
        cfg = self.cfg
        window = _Window(self.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        stop = StopRequest()
        with stop:
            while self.step < self.total_steps:
                t_step = time.perf_counter()
                step_loss, grad_norm, lr = self._optimizer_step(params, window)
                result.losses.append(step_loss)
                self._slowest_step = max(self._slowest_step, time.perf_counter() - t_step)
                window.loss += step_loss
                window.steps += 1
                if bar is not None:
                    bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    self._log_window(window, logger, bar, lr, float(grad_norm), t_start)
                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
                    self._periodic_evaluation(logger, bar)
                    window.t0 = time.perf_counter()
                if self.on_step is not None:
                    self.on_step(self, self.step, step_loss)
                if self._should_stop(stop, started, result):
                    break
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < self.total_steps:
                    result.checkpoint = self.save()
                    last_saved = self.step
                    if cfg.plot and self.info.is_main:
                        plot_curves(logger.path, os.path.join(cfg.out_dir, "curves.png"), quiet=True)
                    window.t0 = time.perf_counter()
        return last_saved

    def _optimizer_step(self, params: List[torch.Tensor], window: _Window):
        """grad_accum micro-batches, clipping, one optimizer and scheduler step -> (the step's loss
        averaged over the processes, the gradient norm, the learning rate the step used)."""
        cfg = self.cfg
        module = self.ddp if self.ddp is not None else self.objective
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
            window.stats += stats
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
        return self._all_reduce(step_loss / cfg.grad_accum).item() / self.info.world_size, grad_norm, lr

    def _log_window(self, window: _Window, logger: JsonlLog, bar, lr: float, grad_norm: float,
                    t_start: float) -> None:
        sums = self._all_reduce(window.stats)
        dt = time.perf_counter() - window.t0
        m = summarize(sums)
        rec = {"type": "train", "step": self.step, "epoch": round(self.consumed / self.plan.per_epoch, 4),
               "loss": window.loss / window.steps, "mlm_loss": m["mlm_loss"], "mlm_acc": m["mlm_acc"],
               **{k: m[k] for k in ("nsp_loss", "nsp_acc") if k in m}, "lr": lr, "grad_norm": grad_norm,
               "tokens_per_s": float(sums[6]) / max(dt, 1e-9), "elapsed_s": round(time.perf_counter() - t_start, 2)}
        logger.write(rec)
        accs = {k: f"{m[k]:.3f}" for k in ("mlm_acc", "nsp_acc") if k in m}
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.3f}", **accs, tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)
        elif self.info.is_main:
            self.print(f"step {self.step}/{self.total_steps}  loss {rec['loss']:.4f}  "
                       f"{'  '.join(f'{k} {v}' for k, v in accs.items())}  lr {lr:.2e}  {rec['tokens_per_s']:.0f} tok/s")
        window.reset()

    def _periodic_evaluation(self, logger: JsonlLog, bar) -> None:
        t_eval = time.perf_counter()
        ev = self.evaluate()
        self._slowest_eval = max(self._slowest_eval, time.perf_counter() - t_eval)
        if ev is not None:
            self.last_eval = ev
            logger.write({"type": "eval", "step": self.step, **ev})
            line = f"held-out at step {self.step}: {eval_line(ev)}"
            if bar is not None:
                bar.write(line)
            else:
                self.print(line)

    def _should_stop(self, stop: StopRequest, started: float, result: TrainResult) -> bool:
        """Whether any process was signalled, reached --stop-after, or would pass the time limit
        within the slowest step and evaluation seen so far (recorded in `result`)."""
        cfg = self.cfg
        out_of_time = (cfg.time_limit is not None
                       and time.time() - started + 1.5 * self._slowest_eval + 2 * self._slowest_step + 15.0
                       > cfg.time_limit)
        asked = stop.signum is not None or (cfg.stop_after is not None and self.step >= cfg.stop_after)
        flag = all_reduce_max(self.info, max(1.0 if asked else 0.0, 2.0 if out_of_time else 0.0))
        if not flag or self.step >= self.total_steps:
            return False
        if flag == 2.0 and stop.signum is None:
            result.time_limited = True
        else:
            result.interrupted = True
            result.signal = stop.signum
        return True

    def _finish(self, result: TrainResult, logger: JsonlLog, last_saved: int, t_start: float) -> None:
        """The final evaluation, checkpoint and curves, and what the run ends with."""
        cfg = self.cfg
        check_replicas(self.info, self.model, self.print)
        if not result.interrupted:
            ev = self.evaluate()
            if ev is not None:
                self.last_eval = ev
                logger.write({"type": "eval", "step": self.step, **ev})
        if self.step != last_saved:
            result.checkpoint = self.save()
        if cfg.plot and self.info.is_main:
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

    def _announce(self) -> None:
        for line in describe_run(self):
            self.print(line)

    # ---- checkpoints: what a run saves, where it resumes from, and how it restores

    def run_state(self) -> Dict[str, Any]:
        d = self.cfg.to_dict()
        return {k: v for k, v in d.items() if k not in TrainConfig.RESUMABLE_CHANGES} | {
            "world_size": self.info.world_size, "data": self.fingerprint}

    def save(self) -> Optional[str]:
        """Checkpoint (every process's RNG state gathered into it) + the model in the output directory."""
        rng = rng_state()
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
            path = save_checkpoint(self.ckpt_dir, state, keep=self.cfg.keep_checkpoints)
            self.save_model()
        barrier(self.info)
        return path

    def save_model(self) -> None:
        """The model and the data's tokenizer files in the output directory (loadable by from_pretrained)."""
        self.model.save_pretrained(self.cfg.out_dir)
        for name in TOKENIZER_FILES:
            src = os.path.join(self.cfg.data_dir, name)
            if os.path.isfile(src) and os.path.abspath(src) != os.path.abspath(os.path.join(self.cfg.out_dir, name)):
                shutil.copyfile(src, os.path.join(self.cfg.out_dir, name))

    def _resolve_resume(self) -> Optional[str]:
        r = self.cfg.resume
        if r is None:
            if not self.cfg.overwrite and os.path.isdir(self.ckpt_dir) and read_manifest(self.ckpt_dir):
                return self._finished_run()
            return None
        if r == "auto":
            try:
                path = find_latest(self.ckpt_dir)
            except CheckpointError as e:
                raise TrainError(f"cannot resume: {e}") from None
            if path is None:
                raise TrainError(f"cannot resume: no checkpoint in {self.ckpt_dir} (nothing was saved there)")
            return path
        if os.path.isdir(r):
            sub = os.path.join(r, "checkpoints")
            try:
                path = find_latest(sub if os.path.isdir(sub) else r)
            except CheckpointError as e:
                raise TrainError(f"cannot resume: {e}") from None
            if path is None:
                raise TrainError(f"cannot resume: no checkpoint in {r}")
            return path
        return r

    def _finished_run(self) -> str:
        """Without --resume, in an output directory that holds checkpoints: the latest, when it is
        the last step of a run with these settings (the command run again, which then finds its
        work done); TrainError otherwise: an unfinished run is continued with --resume, and any run
        there is replaced only with --overwrite."""
        try:
            path = find_latest(self.ckpt_dir)
            state = load_checkpoint(path) if path else None
        except CheckpointError:
            state = None  # not a finished run; --resume names the fault
        if state is None or int(state["step"]) < int(state.get("total_steps") or 0):
            raise TrainError(f"{self.cfg.out_dir} holds checkpoints of an earlier run; pass --resume to continue it or "
                             "--overwrite to start over")
        differ = self._differences(state)
        if differ:
            raise TrainError(f"{self.cfg.out_dir} holds the finished run of other settings ({differ}); use another "
                             "--out, or --overwrite to start over")
        return path

    def _differences(self, state: Dict[str, Any]) -> str:
        """The settings of this run that differ from the checkpoint's, on one line ('' when none)."""
        saved, now = state["run"], self.run_state()
        diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        return "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in diff)

    def restore(self, path: str) -> None:
        try:
            state = load_checkpoint(path)
        except CheckpointError as e:
            raise TrainError(f"cannot resume: {e}") from None
        differ = self._differences(state)
        if differ:
            raise TrainError(f"cannot resume from {path}: the run's settings differ ({differ})")
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
        set_rng_state(rng[self.info.rank])
        self.resumed_from = path

    def close(self) -> None:
        if self.info.owns_group and dist.is_initialized():
            dist.destroy_process_group()



def train(cfg: TrainConfig, info: Optional[DistInfo] = None, **kw) -> TrainResult:
    trainer = Trainer(cfg, info, **kw)
    try:
        return trainer.train()
    finally:
        if info is None:
            trainer.close()
