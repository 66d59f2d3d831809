"""Plain PyTorch reference layers: the ground truth every kernel is tested against.

They are written for clarity, not speed, and they are also the "torch" backend of fastbert.ops.

Dropout everywhere in fastbert uses one counter-based rule, so every backend draws the same mask
from the same seed (and the backward regenerates it instead of storing it):
    element (row r, col c) of the op's [rows, cols] view has counter offset = r * cols + c;
    u = word 0 of Philox-4x32-10 with counter (lo32(offset), hi32(offset), 0, 0), key (lo32(seed), hi32(seed))
        (exactly triton.language.randint(seed, offset));
    the element is kept when (u >> 8) >= dropout_threshold(p) = floor(p * 2**24), scaled by 1 / (1 - p).
Attention dropout (on the softmax probabilities) uses the same rule with its own counter:
    probability (sequence b, head h, query i, key j) has offset = (b * heads + h) * 2**32 + i * 2**16 + j,
    i and j counted from the sequence's first real token (so the padded and the packed layouts of a
    batch draw the same mask); sequences are at most 2**16 tokens long when dropout is on.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

_M32 = 0xFFFFFFFF
_PHILOX_ROUND_A = 0xD2511F53
_PHILOX_ROUND_B = 0xCD9E8D57
_PHILOX_KEY_A = 0x9E3779B9
_PHILOX_KEY_B = 0xBB67AE85


def _mulhilo(a: int, b: torch.Tensor):
    """(high 32 bits, low 32 bits) of a * b for a uint32 constant and a tensor of uint32 in int64."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b >> 16, b & 0xFFFF
    lo_lo = a_lo * b_lo
    mid1 = a_hi * b_lo
    mid2 = a_lo * b_hi
    hi_hi = a_hi * b_hi
    mid = (lo_lo >> 16) + (mid1 & 0xFFFF) + (mid2 & 0xFFFF)
    lo = ((mid & 0xFFFF) << 16) | (lo_lo & 0xFFFF)
    hi = hi_hi + (mid1 >> 16) + (mid2 >> 16) + (mid >> 16)
    return hi & _M32, lo & _M32


def check_seed(seed) -> int:
    """`seed` as an int, checked to lie in [0, 2**63) (the range every backend takes)."""
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"fastbert: dropout seed must be in [0, 2**63), got {seed}")
    return int(seed)


def philox_uint32(seed, offsets: torch.Tensor) -> torch.Tensor:
    """Philox-4x32-10 word 0 for each int64 counter in `offsets` (uint32 values held in int64).

    `seed` is a Python int in [0, 2**63) or a one-element int64 tensor (traceable by torch.compile).
    Bit-identical to triton.language.randint(seed, offsets) and to the C++ extension.
    """
    if isinstance(seed, torch.Tensor):
        seed = seed.reshape(()).to(device=offsets.device, dtype=torch.int64)
    else:
        seed = check_seed(seed)
    offsets = offsets.to(torch.int64)
    c0 = offsets & _M32
    c1 = (offsets >> 32) & _M32
    c2 = torch.zeros_like(offsets)
    c3 = torch.zeros_like(offsets)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _PHILOX_KEY_A) & _M32
        k1 = (k1 + _PHILOX_KEY_B) & _M32
    return c0


def dropout_threshold(p: float) -> int:
    """The 24-bit threshold below which a random word drops its element (see the module docstring)."""
    return int(math.floor(p * (1 << 24)))


def dropout_keep_mask(seed, shape: Sequence[int], p: float, device=None) -> torch.Tensor:
    """Bool mask of kept elements for an op whose inputs have `shape` (last dim = cols)."""
    shape = tuple(shape)
    n = math.prod(shape)
    offsets = torch.arange(n, dtype=torch.int64, device=device)
    u = philox_uint32(seed, offsets)
    return ((u >> 8) >= dropout_threshold(p)).reshape(shape)


def new_seed(generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A fresh dropout seed, an int64 tensor of shape [1] drawn from torch's CPU random state
    (torch.manual_seed makes runs repeatable; a tensor, not an int, so torch.compile traces it)."""
    return torch.randint(0, 2**62, (1,), generator=generator, dtype=torch.int64)


# --------------------------------------------------------------------------------------------
# bias + GELU


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias) over the last dim; "none" is the exact erf form, "tanh" the approximation."""
    return F.gelu(x + bias.to(x.dtype), approximate=approximate)


class BiasGelu(nn.Module):
    def __init__(self, hidden: int, approximate: str = "none"):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.approximate = approximate

    def forward(self, x):
        return bias_gelu(x, self.bias, self.approximate)


# --------------------------------------------------------------------------------------------
# dropout + residual add + LayerNorm


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-12,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    keep_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """layer_norm(dropout(x) + residual) over the last dim, with the fastbert dropout rule.

    The mask comes from `keep_mask` when given, else from `seed` (an int or an int64 tensor of
    shape [1]; a fresh one when None).
    """
    if dropout_p > 0.0:
        if keep_mask is None:
            keep_mask = dropout_keep_mask(new_seed() if seed is None else seed, x.shape, dropout_p, x.device)
        x = x * keep_mask.to(x.dtype) * (1.0 / (1.0 - dropout_p))
    h = x + residual
    return F.layer_norm(h, (h.shape[-1],), weight.to(h.dtype), bias.to(h.dtype), eps)


class AddLayerNorm(nn.Module):
    """BERT's BertSelfOutput / BertOutput tail: LayerNorm(dropout(x) + residual)."""

    def __init__(self, hidden: int, eps: float = 1e-12, dropout_p: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.eps = eps
        self.dropout_p = dropout_p

    def forward(self, x, residual, seed=None):
        p = self.dropout_p if self.training else 0.0
        return add_layer_norm(x, residual, self.weight, self.bias, self.eps, p, seed)


# --------------------------------------------------------------------------------------------
# attention with a padding mask

MAX_DROPOUT_SEQLEN = 1 << 16  # attention dropout counters hold a query and a key position in 16 bits each


def attention_dropout_offsets(
    batch: int, heads: int, seq_q: int, seq_k: int, starts: Optional[torch.Tensor] = None, device=None
) -> torch.Tensor:
    """int64 [batch, heads, seq_q, seq_k]: the attention dropout counter of each probability (see the
    module docstring). starts: int [batch], each sequence's first real position (zeros when None)."""
    if max(seq_q, seq_k) > MAX_DROPOUT_SEQLEN:
        raise ValueError(
            f"attention dropout takes sequences of at most {MAX_DROPOUT_SEQLEN} tokens, got {max(seq_q, seq_k)}"
        )
    b = torch.arange(batch, dtype=torch.int64, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, dtype=torch.int64, device=device).view(1, -1, 1, 1)
    i = torch.arange(seq_q, dtype=torch.int64, device=device).view(1, 1, -1, 1)
    j = torch.arange(seq_k, dtype=torch.int64, device=device).view(1, 1, 1, -1)
    if starts is not None:
        st = starts.to(device=device, dtype=torch.int64).view(-1, 1, 1, 1)
        i, j = (i - st) & 0xFFFF, (j - st) & 0xFFFF  # positions before the start are padding anyway
    return ((b * heads + h) << 32) + (i << 16) + j


def attention_keep_mask(
    seed, batch: int, heads: int, seq_q: int, seq_k: int, p: float, starts: Optional[torch.Tensor] = None, device=None
) -> torch.Tensor:
    """bool [batch, heads, seq_q, seq_k]: the probabilities attention dropout keeps, for `seed`."""
    u = philox_uint32(seed, attention_dropout_offsets(batch, heads, seq_q, seq_k, starts, device))
    return (u >> 8) >= dropout_threshold(p)


def mask_starts(attention_mask: torch.Tensor) -> torch.Tensor:
    """int64 [batch]: the first real position of each row of a [batch, seq] mask (0 for a row with none)."""
    m = attention_mask.to(torch.bool)
    return torch.where(m.any(-1), m.to(torch.int8).argmax(-1), 0).to(torch.int64)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    keep_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, spelled out; q, k, v: [batch, heads, seq, head_dim].

    attention_mask: [batch, seq], 1/True = real token. Padded keys get no weight; padded queries
    return zeros (and pass no gradient), and so does a query with no real key. keep_mask
    ([batch, heads, seq, seq] bool) applies dropout to the probabilities when dropout_p > 0 (drawn
    with torch's RNG when not given; attention_keep_mask gives fastbert's counter-based mask).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if attention_mask is not None:
        keys = attention_mask.to(torch.bool)[:, None, None, :]
        scores = scores.masked_fill(~keys, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows with no real key: all -inf -> zeros
    probs = probs.to(q.dtype)
    if dropout_p > 0.0:
        if keep_mask is None:
            keep_mask = torch.rand_like(probs, dtype=torch.float32) >= dropout_p
        probs = probs * keep_mask.to(probs.dtype) / (1.0 - dropout_p)
    out = torch.matmul(probs, v)
    if attention_mask is not None:
        out = out * attention_mask.to(out.dtype)[:, None, :, None]
    return out


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    keep_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """attention over packed sequences, one at a time; q, k, v: [total_tokens, heads, head_dim],
    cu_seqlens: [batch + 1], sequence b is tokens cu_seqlens[b]:cu_seqlens[b + 1].
    keep_mask: bool [batch, heads, >= max_seqlen, >= max_seqlen] (sequence b uses its top-left corner)."""
    out = torch.zeros_like(q)
    bounds = cu_seqlens.tolist()
    for b in range(len(bounds) - 1):
        lo, hi = bounds[b], bounds[b + 1]
        if hi == lo:
            continue
        qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        keep = None if keep_mask is None else keep_mask[b : b + 1, :, : hi - lo, : hi - lo]
        o = attention(qs, ks, vs, None, dropout_p, scale, keep)
        out[lo:hi] = o.squeeze(0).transpose(0, 1)
    return out


class Attention(nn.Module):
    def __init__(self, dropout_p: float = 0.0, scale: Optional[float] = None):
        super().__init__()
        self.dropout_p = dropout_p
        self.scale = scale

    def forward(self, q, k, v, attention_mask=None):
        p = self.dropout_p if self.training else 0.0
        return attention(q, k, v, attention_mask, p, self.scale)
