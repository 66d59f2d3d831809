"""Flash attention with a padding mask, padded and packed (varlen), forward and backward.

    out = softmax(q k^T * scale (+ rel[j - i]), padded keys masked) v, with dropout on the
    probabilities, optionally q, k first rotated by rotary position embeddings (RoPE), each
    query seeing only the keys within a window (local attention), and a relative position
    bias added to the scores.

The package's modules: `launchers` (`attention_forward` / `attention_backward` /
`varlen_attention_forward` / `varlen_attention_backward`, and for a layer's joined QKV rows
`qkv_attention_forward` / `qkv_attention_backward`, whose launches are bound once per
specialization; plain Python; inputs arrive validated:
q, k, v of one shape, dtype and device, last dim contiguous), `forward` (the forward kernel),
`backward` (the backward kernels), `common` (jit helpers shared by the kernels, and the kernel
that finds a key mask's real range), `rope` (the jit functions of rotary embeddings), `distance`
(those of the window and the relative bias), `args` (the launchers' optional arguments put in the
kernels' form), `settings` (the launch settings table), `variants` (`report_configs`, the
build report's list) and `disentangled` (DeBERTa's disentangled attention: its kernels, launchers
`disentangled_attention_forward` / `disentangled_attention_backward`, settings and variants).

Forward: one program per (query tile of BLOCK_M rows, head, sequence) walks the sequence's keys
in tiles of BLOCK_N with an online softmax in fp32; the [seq x seq] score matrix never leaves
registers. Scores live in the log2 domain (scale * log2(e) folded into one multiply-add), and each
row's log2-sum-exp2 `lse` is saved for the backward (fp32, [batch, heads, seq] padded,
[heads, total_tokens] varlen). Backward: a preprocessing kernel computes delta = rowsum(dO * O)
(fp32, lse's layout); then one kernel gives dq (one program per query tile, looping over the key
tiles) and one gives dk, dv (one program per key tile, looping over the query tiles): no atomics,
so the gradients are deterministic. delta from the stored (rounded) O is off by dO . (O - round(O)),
which leaves a gradient of that size where the true one is 0 (a query with one real key: about
1e-3 in fp16, 8x more in bf16). So the dq kernel also sums rowsum(p * dp), rowsum(p) and p k as
it goes, corrects dq at the end with the exact delta = rowsum(p * dp) / rowsum(p) (one more tile
product per step; the rounded delta only centres the values it multiplies, keeping the
cancellation out of the 16-bit products), and stores it for the dk / dv kernel, which runs after.

Padding. Each sequence's real positions lie in [lo, hi): padded layout with a key mask, the range
from its first to one past its last real token (computed on the device by `mask_range_kernel`, no
host sync; lo = hi = 0 for a row with none); varlen, [0, length) counted from the sequence's first
token (cu_seqlens[b]). Key tiles start at lo and stop at hi, so tiles wholly in padding are never
visited; within [lo, hi) the key mask itself is loaded, so masks with holes stay exact. A query
tile wholly outside [lo, hi) runs no key loop and writes zeros (padded layout) or nothing (varlen:
those rows belong to the next sequence). A query row that outputs zeros (padding, or a hole in
the mask) stores lse = +inf, so the backward's probabilities exp2(s - lse) are exactly 0 on it: it
passes no gradient to q, k or v, and nothing is ever NaN. Masked keys (holes) are handled in the
dk/dv kernel without a per-element select: each program owns its key tile, a key column only ever
feeds its own rows of dk and dv, and those rows are zeroed at the end.

Variants. Three layouts are compiled: EVEN (padded, no mask, S a multiple of both tile sizes: no
bounds checks at all), HAS_MASK (padded with a key mask; a batch with no mask whose S is not a
multiple of the tiles runs it too, with every token real, so S is a runtime int in every variant
and a new length never compiles anything), and VARLEN. head_dim is a runtime int (a multiple of
16) under a power-of-2 block BLOCK_D >= 32 (columns past head_dim masked), so 80, 96 and 128
share a variant. HAS_DROPOUT, RETURN_MASK (forward, not EVEN), ROPE, WINDOW and REL_BIAS are
constexpr flags too.

Local attention (WINDOW, window = w: query i sees the keys j with |i - j| <= w, positions as
rotary's below) and the relative bias (REL_BIAS, rel [H, 2n - 1], n >= S or max_seqlen: the
scaled score of (i, j) gets rel[h, j - i + n - 1]), `distance`. A window of S - 1 or
more (max_seqlen - 1 varlen) reaches every key: it runs the kernels without WINDOW. With one, a
query tile visits only the key tiles (of lo's grid) that hold a key within w of one of its rows,
and the dk / dv kernel's key tile only the query tiles within w of one of its keys: every other
tile is skipped, so the cost grows with the window, not the sequence; the partial tiles set the
scores out of the window to -inf, and a row that has met no key of its window yet keeps its
running max at -inf without making NaN. The bias is read inside the kernels by distance (an fp32
copy times log2(e), [H, 2n - 1]: nothing of [H, S, S] is ever formed), and its gradient drel,
the sum of dS over each diagonal, comes from the dk / dv kernel (the exact delta is there): a
16-bit kernel's tile of dS is skewed so that its diagonals are columns, summed, and added
atomically into fp32 [H, 2n - 1] (one atomic per diagonal per tile pair), an fp32 kernel's small
tile element by element (its sum order, and so its last bits, vary from run to run). Masked keys
have their columns of dS zeroed first (the dk / dv kernel otherwise leaves them unmasked, above).

Rotary embeddings (ROPE, given rope_cos / rope_sin, fastbert.reference.rotary): q and k are
rotated in registers as their tiles are loaded (no rotated copy is written), at positions = the
tile's row indices from the sequence's offset (padded: the row, padding included; varlen: the
index within the sequence), by the fp32 tables [P, D / 2] read with the tile's own mask. RoPE
pairs column i with i + D/2 and register tiles cannot be permuted along their columns, so a
rotated tile is held as its two halves, [rows, BLOCK_D / 2] each (columns past D/2 masked; the
halves are at least 16 wide, as tl.dot needs, since BLOCK_D >= 32): rotated in fp32, cast to the
input dtype, and q k^T = q_a k_a^T + q_b k_b^T (one chained product, the same FLOPs). dq and dk
accumulate as the two halves of the gradient of the rotated tile and are rotated back (the
transpose) as they are stored; v, dv and everything else are unchanged. Every head dim above
takes ROPE, 16 included (halves of 8 in 16-wide blocks). Its jit functions live in
`rope`; with ROPE off they are the plain loads, products and stores, and compile to the
same code as without them.

Dropout follows fastbert.reference bit for bit: probability (b, h, i, j) has the Philox counter
offset = (b * heads + h) * 2**32 + ((i - lo) & 0xFFFF) * 2**16 + ((j - lo) & 0xFFFF), i.e.
tl.randint(seed, offset), built here as its two 32-bit words and passed to tl.philox (what
tl.randint does with an int64 offset) so that no int64 tile is formed; it is kept when
(u >> 8) >= floor(p * 2**24). It acts on the normalised probabilities (the row sum l includes the
dropped ones; kept ones are scaled by 1 / (1 - p)); the backward regenerates it. With
return_dropout_mask the forward also writes the keep-mask (a debug path: each program first
writes its rows of the [S x S] block, every column, and its key loop then reads its mask back
from there instead of drawing it).

Matrix products accumulate in fp32; fp16 / bf16 inputs feed the tensor cores directly, fp32 inputs
use input_precision="tf32x3" on the GPU (three TF32 tensor-core products, about fp32 accuracy) and
"ieee" under the interpreter (which computes every product exactly in fp32 anyway).
Strides: the kernels are built for 16-byte aligned q, k, v, dO with every stride a multiple of 16
elements (true of contiguous tensors and of views into a fused [B, S, 3, H, D] projection);
anything else is copied first (`_aligned`). Offsets of whole sequences and heads are int64.
"""
from __future__ import annotations

from .launchers import (
    attention_backward,
    attention_forward,
    qkv_attention_backward,
    qkv_attention_forward,
    varlen_attention_backward,
    varlen_attention_forward,
)
from .settings import BLOCK_DS, HEAD_DIMS, KERNELS, block_d, settings
from .variants import report_configs

__all__ = [
    "attention_forward", "attention_backward", "varlen_attention_forward", "varlen_attention_backward",
    "qkv_attention_forward", "qkv_attention_backward",
    "HEAD_DIMS", "BLOCK_DS", "KERNELS", "block_d", "settings", "report_configs",
]
