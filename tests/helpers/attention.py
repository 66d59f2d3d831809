"""Inputs and checks of the attention tests: padding masks (right, left, with holes), q / k / v and
their gradients on fresh leaves, a padded case with the reference's dropout mask, packed against
padded, and one comparison of output and dq, dk, dv with the error bound."""
import torch

import fastbert
from fastbert import reference
from tests.helpers.backends import device_for
from tests.helpers.bounds import assert_within_bound


def mixed_mask(batch, seq, g, left=False):
    """Rows: full, partly padded (random lengths), fully padded; left-padded rows when `left`."""
    lengths = [seq, 0] + torch.randint(1, seq + 1, (batch - 2,), generator=g).tolist()
    mask = torch.zeros(batch, seq, dtype=torch.int64)
    for b, n in enumerate(lengths):
        if left and b % 2 == 1:
            mask[b, seq - n :] = 1
        else:
            mask[b, :n] = 1
    return mask


def holey_mask(batch, seq, g):
    """Rows: full, then random real tokens with holes anywhere (each token real with probability 3/4)."""
    mask = (torch.rand(batch, seq, generator=g) < 0.75).to(torch.int64)
    mask[0] = 1
    return mask


def qkv(shape, dtype, dev, g):
    return [torch.randn(shape, generator=g).to(dev, dtype) for _ in range(3)]


def run(fn, inputs, dout):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(dout.to(out.dtype))
    return out.detach(), [t.grad for t in leaves]


def padded_case(backend, batch, heads, seq, head_dim, dtype, seed, dropout_p=0.0, left=False, dropout_seed=5,
                holes=False):
    """(q, k, v, dout, mask, keep-mask, generator) of a padded attention check on fresh inputs; keep is
    the reference's dropout mask for dropout_seed (what the kernels draw for it). holes: a mask with
    holes anywhere (holey_mask) instead of left or right padding."""
    dev = device_for(backend)
    g = torch.Generator().manual_seed(seed)
    q, k, v = qkv((batch, heads, seq, head_dim), dtype, dev, g)
    dout = torch.randn(batch, heads, seq, head_dim, generator=g).to(dev, dtype)
    mask = (holey_mask(batch, seq, g) if holes else mixed_mask(batch, seq, g, left)).to(dev)
    keep = reference.attention_keep_mask(dropout_seed, batch, heads, seq, seq, dropout_p, reference.mask_starts(mask), dev)
    return q, k, v, dout, mask, keep, g


def varlen_lengths(backend, dev, long=(97, 128, 64), short=(33, 17)):
    """(lengths, cu_seqlens, max_seqlen) of a varlen check: an empty sequence, a one-token one and
    longer ones (`short` on the triton backend, whose interpreter is slow, else `long`); max_seqlen
    three above the longest, as the ops allow."""
    lengths = [5, 1, 0, *(short if backend == "triton" else long)]
    cu_seqlens = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    return lengths, cu_seqlens, max(lengths) + 3


def pack(t, mask):
    """[batch, heads, seq, d] -> [total_tokens, heads, d] over the real tokens of mask."""
    return fastbert.ops.unpad(t.transpose(1, 2), mask)[0]


def assert_packed_agrees_with_padded(backend, g, seq=40, make_options=lambda heads, seq, dev: {}):
    """varlen_attention on the packed real tokens gives the padded attention's rows (right padding:
    a token's position is its index in its sequence either way); options from make_options."""
    dev = device_for(backend)
    batch, heads = 4, 2
    q, k, v = qkv((batch, heads, seq, 64), torch.float32, dev, g)
    mask = mixed_mask(batch, seq, g).to(dev)
    options = make_options(heads, seq, dev)
    _, _, cu, n = fastbert.ops.unpad(mask[..., None], mask)
    padded = fastbert.ops.attention(q, k, v, mask, backend=backend, **options)
    packed = fastbert.ops.varlen_attention(*(pack(t, mask) for t in (q, k, v)), cu, n, backend=backend, **options)
    torch.testing.assert_close(packed, pack(padded, mask), atol=1e-5, rtol=1e-5)


def compare(tag, op, ref, inputs, dout, dtype, real=None):
    """op's output and input gradients against ref's in the same dtype and in fp64 (at `real` positions)."""
    got = run(op, inputs, dout)
    same = run(ref, inputs, dout)
    r64 = run(ref, [t.double() for t in inputs], dout.double())
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        a, b, c = ((r[0] if i == 0 else r[1][i - 1]) for r in (got, same, r64))
        assert torch.isfinite(a).all(), f"{tag} {name}: non-finite values"
        if real is not None:
            a, b, c = a[real], b[real], c[real]
        assert_within_bound(f"{tag} {name}", a, b, c, dtype)
