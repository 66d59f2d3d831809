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
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from fastbert.files import read_json, write_json

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
