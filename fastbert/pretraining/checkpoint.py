"""Training checkpoints: written atomically, verified on load.

A checkpoint is one file, <dir>/step-<step>.pt (torch.save of a dict of plain types and tensors),
written under a temporary name, flushed to disk and renamed into place. The manifest
<dir>/checkpoints.json (also written by rename) lists every kept checkpoint with its size and
SHA-256 and names the latest. Loading checks the file against the manifest, reads it with
weights_only=True, and checks its format and keys: a truncated, damaged or foreign file is reported
by name (CheckpointError), never skipped in favour of starting over.
"""
from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from fastbert.files import read_json, write_json
from fastbert.pretraining.config import TrainConfig, TrainError
from fastbert.pretraining.distributed import barrier

FORMAT = "fastbert-pretrain-checkpoint"
VERSION = 1
MANIFEST = "checkpoints.json"
REQUIRED_KEYS = ("format", "version", "step", "consumed", "model", "optimizer", "scheduler", "rng", "run")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from (missing, partial, damaged, or from another run)."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(directory: str) -> Optional[dict]:
    path = os.path.join(directory, MANIFEST)
    try:
        manifest = read_json(path)
        if manifest is not None and not isinstance(manifest.get("checkpoints"), dict):
            raise ValueError("no 'checkpoints' table")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint manifest {path} is damaged ({e})") from None
    return manifest


def save_checkpoint(directory: str, state: Dict[str, Any], *, keep: int = 2) -> str:
    """Write `state` as <directory>/step-<state['step']>.pt atomically, record it in the manifest,
    and delete the oldest checkpoints beyond `keep` (0 keeps all). Returns the path."""
    os.makedirs(directory, exist_ok=True)
    state = dict(state, format=FORMAT, version=VERSION)
    name = checkpoint_name(int(state["step"]))
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getbuffer()
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    digest = hashlib.sha256(data).hexdigest()
    os.replace(tmp, path)
    manifest = read_manifest(directory) or {"checkpoints": {}}
    manifest["checkpoints"][name] = {"step": int(state["step"]), "bytes": len(data), "sha256": digest}
    manifest["latest"] = name
    if keep > 0:
        names = sorted(manifest["checkpoints"], key=lambda n: manifest["checkpoints"][n]["step"])
        for old in names[:-keep]:
            manifest["checkpoints"].pop(old)
    write_json(os.path.join(directory, MANIFEST), manifest)
    if keep > 0:  # files the manifest no longer lists (written before it was updated)
        for f in os.listdir(directory):
            if f.startswith("step-") and f.endswith(".pt") and f not in manifest["checkpoints"]:
                try:
                    os.remove(os.path.join(directory, f))
                except OSError:
                    pass
    return path


def find_latest(directory: str) -> Optional[str]:
    """The latest checkpoint the manifest of `directory` names, or None when there is no manifest.
    A manifest naming a file that is gone is an error."""
    manifest = read_manifest(directory)
    if manifest is None:
        stray = sorted(f for f in os.listdir(directory) if f.endswith(".pt")) if os.path.isdir(directory) else []
        if stray:
            raise CheckpointError(
                f"{directory} holds checkpoint files ({', '.join(stray)}) but no manifest {MANIFEST}; "
                "name one with --resume PATH"
            )
        return None
    latest = manifest.get("latest")
    if not latest:
        return None
    path = os.path.join(directory, latest)
    if not os.path.isfile(path):
        raise CheckpointError(f"the latest checkpoint {path} named in {MANIFEST} is missing")
    return path


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Read and verify a checkpoint file (size and SHA-256 against the manifest when it lists the
    file, the format and the keys); CheckpointError naming the file and the fault otherwise."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    directory, name = os.path.split(os.path.abspath(path))
    manifest = read_manifest(directory)
    entry = manifest["checkpoints"].get(name) if manifest else None
    if entry is not None:
        size = os.path.getsize(path)
        if size != entry["bytes"]:
            raise CheckpointError(
                f"checkpoint {path} is {size} bytes but {entry['bytes']} were written: it is partial or damaged"
            )
        if _sha256(path) != entry["sha256"]:
            raise CheckpointError(f"checkpoint {path} does not match the SHA-256 recorded when it was written: it is damaged")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: it is partial or damaged ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a fastbert pretraining checkpoint")
    if state.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has version {state.get('version')}; this fastbert reads version {VERSION}")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}: it is damaged or incomplete")
    return state


# --------------------------------------------------------------------------------------------
# RNG states as plain types (weights_only loading reads them)


def rng_state() -> Dict[str, Any]:
    np_state = np.random.get_state()
    py = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": {"version": py[0], "state": list(py[1]), "gauss": py[2]},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def list_checkpoints(directory: str) -> List[str]:
    manifest = read_manifest(directory)
    if not manifest:
        return []
    return [os.path.join(directory, n) for n in sorted(manifest["checkpoints"], key=lambda n: manifest["checkpoints"][n]["step"])]


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


class TrainerCheckpoints:
    """The Trainer's checkpoints: what a run saves, where it resumes from, and how it restores."""

    def run_state(self) -> Dict[str, Any]:
        d = self.cfg.to_dict()
        return {k: v for k, v in d.items() if k not in TrainConfig.RESUMABLE_CHANGES} | {
            "world_size": self.info.world_size, "data": self.fingerprint}

    def save(self, log_record: Optional[Dict[str, Any]] = None) -> Optional[str]:
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
