"""The optimizer's schedule: AdamW parameter groups (no weight decay on biases and LayerNorm) and
linear warm-up then linear decay to zero."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from torch import nn


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


def warmup_steps(warmup: float, total_steps: int) -> int:
    """Warm-up steps from a fraction of the run (< 1) or a number of steps (>= 1)."""
    return int(round(warmup * total_steps)) if warmup < 1 else int(warmup)
