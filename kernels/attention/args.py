"""The attention launchers' optional arguments, checked and put in the form the kernels take
(plain Python, run by the launchers of `fastbert.kernels.attention`): dropout (seed, threshold,
scale), the rotary tables (ROPE_COS, ROPE_SIN), and the two options that depend on the distance
between key and query (`distance`): the local window and the relative bias (REL, rel_n,
window), with the fp32 buffer its gradient is added into.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

import torch

LOG2E = 1.4426950408889634


# one zero-size tensor per (dtype, device), made at first use: what stands for an absent argument
_ABSENT: Dict[Tuple[torch.dtype, torch.device], torch.Tensor] = {}


def optional_tensor(t: Optional[torch.Tensor], dtype: torch.dtype, device) -> torch.Tensor:
    """t, or for None the zero-size tensor of its type on `device`: a variant that never reads a
    pointer argument still gets a tensor, and an absent one allocates nothing per call."""
    if t is not None:
        return t
    absent = _ABSENT.get((dtype, device))
    if absent is None:
        absent = _ABSENT[(dtype, device)] = torch.empty(0, dtype=dtype, device=device)
    return absent


def rope_tables(rope_cos: Optional[torch.Tensor], rope_sin: Optional[torch.Tensor], head_dim: int, positions: int,
                device) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """None without rotary embeddings; else (cos, sin), fp32 [P >= positions, head_dim / 2] on
    q's device, each contiguous and 16-byte aligned as the kernels read it (copied if not)."""
    if rope_cos is None and rope_sin is None:
        return None
    if rope_cos is None or rope_sin is None:
        raise ValueError("fastbert: rotary attention needs both rope_cos and rope_sin")
    for t in (rope_cos, rope_sin):
        if (t.dim() != 2 or t.shape[0] < positions or t.shape[1] != head_dim // 2 or t.dtype != torch.float32
                or t.device != device):
            raise ValueError(f"fastbert: rotary tables must be float32 [>= {positions}, {head_dim // 2}] on {device}, "
                             f"got {t.dtype} {list(t.shape)} on {t.device}")
    return tuple(t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)
                 for t in (rope_cos, rope_sin))


def rope_args(rope, device) -> Tuple[torch.Tensor, torch.Tensor]:
    # the kernels' ROPE_COS, ROPE_SIN (empty, never read, without rotary)
    return rope if rope is not None else (optional_tensor(None, torch.float32, device),) * 2


class DistanceOptions(NamedTuple):
    window: int  # local attention's reach; -1: every key (WINDOW off)
    rel: Optional[torch.Tensor]  # the relative bias times log2(e), fp32 [H, 2n - 1] contiguous (None: REL_BIAS off)
    rel_n: int  # n

    @property
    def local(self) -> bool:
        return self.window >= 0

    @property
    def relative(self) -> bool:
        return self.rel is not None

    def args(self, device) -> Tuple[torch.Tensor, int, int]:
        """The kernels' REL, rel_n, window."""
        return optional_tensor(self.rel, torch.float32, device), self.rel_n, max(self.window, 0)

    def grad_buffer(self, device) -> torch.Tensor:
        """The backward's DREL: zeroed fp32 [H, 2n - 1] for the dk / dv kernel to add into (empty
        without a bias)."""
        return torch.zeros_like(self.rel) if self.rel is not None else optional_tensor(None, torch.float32, device)


def distance_options(window: int, rel_bias: Optional[torch.Tensor], heads: int, positions: int, device) -> DistanceOptions:
    """The window and the relative bias of a call over sequences of at most `positions` tokens. A
    window of positions - 1 or more reaches every key of every row: none (the kernels without
    WINDOW). rel_bias: None, or float [heads, 2n - 1] with n >= positions on q's device, read by
    the kernels as an fp32 copy times log2(e) (the scores' domain)."""
    window = -1 if window is None or window < 0 or window >= positions - 1 else int(window)
    if rel_bias is None:
        return DistanceOptions(window, None, 0)
    if (rel_bias.dim() != 2 or rel_bias.shape[0] != heads or rel_bias.shape[1] % 2 == 0
            or (rel_bias.shape[1] + 1) // 2 < positions or not rel_bias.dtype.is_floating_point
            or rel_bias.device != device):
        raise ValueError(f"fastbert: the relative bias must be a float tensor [{heads}, 2n - 1] with n >= {positions} "
                         f"on {device}, got {rel_bias.dtype} {list(rel_bias.shape)} on {rel_bias.device}")
    rel = (rel_bias.detach().to(torch.float32) * LOG2E).contiguous()
    return DistanceOptions(window, rel, (rel_bias.shape[1] + 1) // 2)
