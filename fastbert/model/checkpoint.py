"""Checkpoint files in transformers' format: reading model.safetensors / pytorch_model.bin and
the key names older checkpoints used."""
from __future__ import annotations

import os
from typing import Dict

import torch

SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME = "pytorch_model.bin"


def normalise_keys(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.endswith("position_ids") or k.endswith("embeddings.token_type_ids"):
            continue  # buffers older checkpoints saved
        if "LayerNorm" in k or "layer_norm" in k:
            k = k.replace(".gamma", ".weight").replace(".beta", ".bias")
        out[k] = v
    return out


def load_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of model.safetensors (preferred) or pytorch_model.bin in `path`, with clear errors."""
    safe = os.path.join(path, SAFE_WEIGHTS_NAME)
    pt = os.path.join(path, WEIGHTS_NAME)
    if os.path.isfile(safe):
        from safetensors.torch import load_file

        try:
            return load_file(safe)
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise ValueError(f"fastbert: {safe} could not be read; the file is damaged or not safetensors ({e})") from None
    if os.path.isfile(pt):
        try:
            return torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"fastbert: {pt} could not be read ({e})") from None
    raise FileNotFoundError(f"fastbert: {path} has no {SAFE_WEIGHTS_NAME} or {WEIGHTS_NAME}")
