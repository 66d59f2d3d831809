"""Local (sliding-window) attention, fastbert.ops.attention / varlen_attention(window=w), on every
backend against the reference (each query sees the keys at most w positions away): outputs and
dq, dk, dv at real-token positions with the bound of STYLE.md lesson 4; with dropout, rotary
embeddings (ModernBERT's local layers), left padding and masks with holes; packed and padded
agree. The Triton kernels skip the key (query) tiles out of every row's window: checked by what
they never read."""
import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.attention import assert_packed_agrees_with_padded, compare, mixed_mask, padded_case, qkv, varlen_lengths
from tests.helpers.backends import device_for, dtypes_for, require


def check_local(backend, batch, heads, seq, head_dim, dtype, window, seed, dropout_p=0.0, rotary_base=None,
                left=False, holes=False):
    q, k, v, dout, mask, keep, g = padded_case(backend, batch, heads, seq, head_dim, dtype, seed, dropout_p, left,
                                               holes=holes)
    tables = reference.rotary_tables(rotary_base, head_dim, seq, q.device) if rotary_base else None

    def op(*t):
        return fastbert.ops.attention(*t, mask, dropout_p=dropout_p, seed=5, backend=backend, window=window,
                                      rotary_base=rotary_base)

    def ref(q_, k_, v_):
        if tables:
            q_, k_ = (reference.rotate(t, *tables) for t in (q_, k_))
        return reference.attention(q_, k_, v_, mask, dropout_p, keep_mask=keep, window=window)

    tag = f"{backend} local w{window} b{batch} s{seq} d{head_dim} {dtype} p{dropout_p} rope {rotary_base}"
    compare(tag, op, ref, [q, k, v], dout, dtype, mask.bool()[:, None, :, None].expand(q.shape))


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 1, 3, 16, 40])
def test_local_attention_matches_reference(backend, window):
    # the Triton tiles are 16 to 128 rows: windows narrower and wider than a tile, sequences of
    # one tile and of several (the cpp kernel blocks long sequences)
    seqs = [9, 70] if backend == "triton" else [9, 40, 70, 300, 700]
    for i, seq in enumerate(seqs):
        for dtype in dtypes_for(backend):
            check_local(backend, 3, 2, seq, (32, 64)[i % 2], dtype, window, seed=i)


@pytest.mark.slow_with("torch", "triton")
def test_local_attention_with_dropout_rotary_and_left_padding(backend):
    seq = 70 if backend == "triton" else 300
    check_local(backend, 4, 2, seq, 64, torch.float32, 16, seed=1, dropout_p=0.1, rotary_base=10000.0, left=True)


@pytest.mark.slow_with("triton")
def test_local_attention_with_holes_in_the_mask(backend):
    for dtype in dtypes_for(backend):
        check_local(backend, 3, 2, 40, 32, dtype, 5, seed=4, holes=True)
    check_local(backend, 3, 2, 40, 32, torch.float32, 20, seed=5, dropout_p=0.1, rotary_base=160000.0, holes=True)


def test_a_window_as_wide_as_the_sequence_is_global_attention(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(2)
    q, k, v = qkv((2, 2, 33, 32), torch.float32, dev, g)
    mask = mixed_mask(2, 33, g).to(dev)
    want = fastbert.ops.attention(q, k, v, mask, backend=backend)
    for window in (32, 33, 1000):
        got = fastbert.ops.attention(q, k, v, mask, backend=backend, window=window)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_local_varlen_matches_reference_and_padded(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(6)
    lengths, cu_seqlens, max_seqlen = varlen_lengths(backend, dev, long=(300, 128, 64), short=(45, 17))
    total, window = sum(lengths), 16
    for dtype in dtypes_for(backend):
        q, k, v = qkv((total, 3, 64), dtype, dev, g)
        dout = torch.randn(total, 3, 64, generator=g).to(dev, dtype)

        def op(*t):
            return fastbert.ops.varlen_attention(*t, cu_seqlens, max_seqlen, backend=backend, window=window,
                                                 rotary_base=10000.0)

        def ref(*t):
            cos, sin = reference.rotary_tables(10000.0, 64, max_seqlen, dev)
            q_, k_ = (reference.rotate_packed(x, cu_seqlens, cos, sin) for x in t[:2])
            return reference.varlen_attention(q_, k_, t[2], cu_seqlens, window=window)

        compare(f"{backend} local rotary varlen {dtype}", op, ref, [q, k, v], dout, dtype)
    assert_packed_agrees_with_padded(backend, g, make_options=lambda *_: dict(window=window))


@pytest.mark.slow
@pytest.mark.triton
def test_triton_local_attention_skips_the_tiles_out_of_the_window():
    # NaN in key and value 0: a query tile that visited key 0's tile would get NaN (0 * NaN in
    # p v, even where the window masks the score), and so would the gradients of a key tile that
    # visited query 0's tile. Rows 256 on lie more than a tile plus the window from row 0: the
    # kernels never visit it from there, and those rows match the reference, all finite.
    require("triton")
    dev = device_for("triton")
    g = torch.Generator().manual_seed(9)
    seq, window = 512, 8
    q, k, v = qkv((1, 2, seq, 32), torch.float32, dev, g)
    for t in (q, k, v):
        t[:, :, 0] = float("nan")
    dout = torch.randn(q.shape, generator=g).to(dev)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = fastbert.ops.attention(*leaves, backend="triton", window=window)
    out.backward(dout)
    # the reference on rows 256 - 2 window on: rows 256 on, and every row they meet, see all their keys
    first = 256 - 2 * window
    clean = [t[:, :, first:].clone().requires_grad_(True) for t in (q, k, v)]
    want = reference.attention(*clean, window=window)
    want.backward(dout[:, :, first:])
    for name, a, b in zip(("out", "dq", "dk", "dv"), [out] + [t.grad for t in leaves], [want] + [t.grad for t in clean]):
        a, b = a[:, :, 256:], b[:, :, 256 - first:]
        assert torch.isfinite(a).all(), f"{name}: a tile out of the window was visited"
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def test_window_errors():
    q = torch.randn(1, 2, 8, 16)
    for bad in (-1, 2.0, True, "64"):
        with pytest.raises(ValueError, match="window must be an int >= 0"):
            fastbert.ops.attention(q, q, q, window=bad, backend="torch")
