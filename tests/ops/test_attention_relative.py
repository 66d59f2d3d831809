"""A relative position bias inside attention (MPNet's): fastbert.ops.attention / varlen_attention
(relative_bias=rel), rel [heads, 2n - 1] read by the distance j - i inside the kernel, on every
backend against the reference (the bias spread to [heads, seq, seq] and added to the scaled
scores). Outputs, dq, dk, dv and the bias's own gradient, with the bound of STYLE.md lesson 4;
with padding (left and right, and holes), dropout, a window and rotary embeddings; packed."""
import pytest
import torch

import fastbert
from fastbert import layouts, reference
from tests.helpers.attention import assert_packed_agrees_with_padded, padded_case, qkv, run, varlen_lengths
from tests.helpers.backends import device_for, dtypes_for
from tests.helpers.bounds import assert_within_bound


def check_all(tag, op, ref, inputs, dout, dtype, real=None):
    names = ("out", "dq", "dk", "dv", "drel")
    got, same, r64 = run(op, inputs, dout), run(ref, inputs, dout), run(ref, [t.double() for t in inputs], dout.double())
    for i, name in enumerate(names[: 1 + len(inputs)]):
        a, b, c = ((r[0] if i == 0 else r[1][i - 1]) for r in (got, same, r64))
        if real is not None and i < 4:
            a, b, c = a[real], b[real], c[real]
        assert_within_bound(f"{tag} {name}", a, b, c, dtype)


def check_relative(backend, batch, heads, seq, head_dim, dtype, seed, dropout_p=0.0, window=None, left=False, extra=3,
                   holes=False, rotary_base=None):
    q, k, v, dout, mask, keep, g = padded_case(backend, batch, heads, seq, head_dim, dtype, seed, dropout_p, left,
                                               holes=holes)
    rel = layouts.relative_bias(torch.randn(32, heads, generator=g), seq + extra).to(q.device, dtype)  # n > seq
    tables = reference.rotary_tables(rotary_base, head_dim, seq, q.device) if rotary_base else None

    def op(q_, k_, v_, r_):
        return fastbert.ops.attention(q_, k_, v_, mask, dropout_p=dropout_p, seed=5, backend=backend, window=window,
                                      relative_bias=r_, rotary_base=rotary_base)

    def ref(q_, k_, v_, r_):
        if tables:
            q_, k_ = (reference.rotate(t, *tables) for t in (q_, k_))
        return reference.attention(q_, k_, v_, mask, dropout_p, keep_mask=keep, window=window,
                                   bias=layouts.relative_bias_matrix(r_, seq))

    tag = f"{backend} relative b{batch} s{seq} d{head_dim} {dtype} p{dropout_p} w{window} rope {rotary_base}"
    check_all(tag, op, ref, [q, k, v, rel], dout, dtype, mask.bool()[:, None, :, None].expand(q.shape))


@pytest.mark.slow_with("cpp", "triton")
def test_relative_bias_matches_reference(backend):
    # one tile and several (the Triton tiles are 16 to 128 rows)
    seqs = [7, 33, 70] + ([130, 300] if backend == "cpp" else [])
    for i, seq in enumerate(seqs):
        for dtype in dtypes_for(backend):
            check_relative(backend, 3, 2, seq, (32, 64)[i % 2], dtype, seed=i)


@pytest.mark.slow_with("cpp", "triton")
def test_relative_bias_with_dropout_window_and_left_padding(backend):
    check_relative(backend, 4, 2, 40, 64, torch.float32, seed=2, dropout_p=0.1, left=True)
    for dtype in dtypes_for(backend):
        check_relative(backend, 3, 2, 70 if backend != "cpp" else 300, 32, dtype, seed=3, window=16)


@pytest.mark.slow_with("triton")
def test_relative_bias_with_holes_in_the_mask_and_rotary(backend):
    for dtype in dtypes_for(backend):
        check_relative(backend, 3, 2, 40, 32, dtype, seed=6, holes=True)
    check_relative(backend, 3, 2, 40, 64, torch.float32, seed=7, holes=True, dropout_p=0.1, window=3,
                   rotary_base=10000.0)


@pytest.mark.slow_with("torch", "triton")
def test_relative_bias_varlen_matches_reference_and_padded(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(5)
    lengths, cu_seqlens, max_seqlen = varlen_lengths(backend, dev, long=(130, 64))
    total = sum(lengths)
    for dtype in dtypes_for(backend):
        q, k, v = qkv((total, 3, 64), dtype, dev, g)
        rel = layouts.relative_bias(torch.randn(32, 3, generator=g), max_seqlen).to(dev, dtype)
        dout = torch.randn(total, 3, 64, generator=g).to(dev, dtype)

        def op(*t):
            return fastbert.ops.varlen_attention(*t[:3], cu_seqlens, max_seqlen, backend=backend, relative_bias=t[3])

        def ref(*t):
            return reference.varlen_attention(*t[:3], cu_seqlens, relative=t[3])

        check_all(f"{backend} relative varlen {dtype}", op, ref, [q, k, v, rel], dout, dtype)
    assert_packed_agrees_with_padded(backend, g, make_options=lambda heads, seq, dev: dict(
        relative_bias=layouts.relative_bias(torch.randn(32, heads, generator=g), seq).to(dev)))


def test_relative_bias_is_mpnet_s():
    from transformers.models.mpnet import modeling_mpnet as mp

    seq, heads = 300, 4
    table = torch.nn.Embedding(32, heads)
    rel = torch.arange(seq)[None, :] - torch.arange(seq)[:, None]
    want = table(mp.MPNetEncoder.relative_position_bucket(rel)).permute(2, 0, 1)
    got = layouts.relative_bias_matrix(layouts.relative_bias(table.weight, seq), seq)
    assert torch.equal(got, want)


def test_relative_bias_errors():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"relative_bias must be \[heads, 2n - 1\] with heads = 2 and n >= 8"):
        fastbert.ops.attention(q, q, q, relative_bias=torch.zeros(2, 13), backend="torch")
    with pytest.raises(ValueError, match="relative_bias must be"):
        fastbert.ops.attention(q, q, q, relative_bias=torch.zeros(3, 15), backend="torch")
    with pytest.raises(TypeError, match="relative_bias"):
        fastbert.ops.attention(q, q, q, relative_bias=torch.zeros(2, 15, dtype=torch.int64), backend="torch")
