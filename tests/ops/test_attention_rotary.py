"""Rotary position embedding inside fastbert.ops.attention / varlen_attention (rotary_base=...),
on every backend, against the reference: q and k rotated by fastbert.reference.rotary, then the
reference attention. Outputs and dq, dk, dv (the gradients of the unrotated q and k) are compared
at real-token positions with the bound of STYLE.md lesson 4."""
import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.attention import assert_packed_agrees_with_padded, compare, padded_case, qkv, varlen_lengths
from tests.helpers.backends import device_for, dtypes_for

BASES = (10000.0, 160000.0)  # ModernBERT's local and global layers


def rotated_reference(base, seq, head_dim, dev):
    cos, sin = reference.rotary_tables(base, head_dim, seq, dev)

    def ref(q_, k_, v_, mask, p, keep):
        return reference.attention(reference.rotate(q_, cos, sin), reference.rotate(k_, cos, sin), v_, mask, p,
                                   keep_mask=keep)

    return ref


def check_rotary(backend, batch, heads, seq, head_dim, dtype, dropout_p, seed, base, left=False):
    q, k, v, dout, mask, keep, _ = padded_case(backend, batch, heads, seq, head_dim, dtype, seed, dropout_p, left)
    rotated = rotated_reference(base, seq, head_dim, q.device)

    def op(*t):
        return fastbert.ops.attention(*t, mask, dropout_p=dropout_p, seed=5, backend=backend, rotary_base=base)

    def ref(*t):
        return rotated(*t, mask, dropout_p, keep)

    real = mask.bool()[:, None, :, None].expand(q.shape)
    tag = f"{backend} rotary {base:g} b{batch} s{seq} d{head_dim} {dtype} p{dropout_p}{' left' if left else ''}"
    compare(tag, op, ref, [q, k, v], dout, dtype, real)


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("base", BASES)
def test_rotary_attention_matches_reference(backend, base):
    seqs = [7, 33, 64] if backend == "triton" else [7, 33, 64, 130]
    for i, seq in enumerate(seqs):
        head_dim = (16, 32, 64, 80)[i % 4]
        for dtype in dtypes_for(backend):
            check_rotary(backend, 3, 2, seq, head_dim, dtype, 0.0, seed=i, base=base)


def test_rotary_attention_dropout_and_left_padding(backend):
    # left padding: a row's position is its index in the padded batch, as transformers counts it
    check_rotary(backend, 4, 2, 33, 64, torch.float32, 0.1, seed=3, base=BASES[1], left=True)


def test_rotary_attention_odd_widths(backend):
    # head dims whose halves are not a multiple of the vector width (the cpp and torch backends)
    if backend == "triton":
        pytest.skip("the triton backend takes only the head dims 16, 32, 64, 80, 96, 128 (its error: test_attention.py)")
    for head_dim in (2, 20, 48):
        check_rotary(backend, 3, 2, 19, head_dim, torch.float32, 0.0, seed=head_dim, base=BASES[0])


@pytest.mark.slow_with("triton")
def test_rotary_varlen_matches_reference_and_padded(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(8)
    lengths, cu_seqlens, max_seqlen = varlen_lengths(backend, dev)
    total, base = sum(lengths), BASES[1]
    cos, sin = reference.rotary_tables(base, 64, max_seqlen, dev)
    for dtype in dtypes_for(backend):
        q, k, v = qkv((total, 3, 64), dtype, dev, g)
        dout = torch.randn(total, 3, 64, generator=g).to(dev, dtype)

        def op(*t):
            return fastbert.ops.varlen_attention(*t, cu_seqlens, max_seqlen, backend=backend, rotary_base=base)

        def ref(q_, k_, v_):
            q_, k_ = (reference.rotate_packed(t, cu_seqlens, cos, sin) for t in (q_, k_))
            return reference.varlen_attention(q_, k_, v_, cu_seqlens)

        compare(f"{backend} rotary varlen {dtype}", op, ref, [q, k, v], dout, dtype)
    assert_packed_agrees_with_padded(backend, g, make_options=lambda *_: dict(rotary_base=base))


def test_rotary_tables_first_made_in_inference_mode_still_serve_a_backward(backend):
    # the tables are cached: one built under torch.inference_mode() (an evaluation) must not be an
    # inference tensor when a training step later saves it for its backward
    import sys

    sys.modules["fastbert.ops.attention"].rotary_tables.cache_clear()
    dev = device_for(backend)
    q = torch.randn(1, 2, 9, 32, device=dev)
    with torch.inference_mode():
        fastbert.ops.attention(q, q, q, backend=backend, rotary_base=1234.0)
    leaves = [torch.randn(1, 2, 9, 32, device=dev, requires_grad=True) for _ in range(3)]
    fastbert.ops.attention(*leaves, backend=backend, rotary_base=1234.0).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


def test_rotary_matches_transformers_modernbert():
    # the convention (rotate-half, inv_freq, positions) is transformers' own
    from transformers import ModernBertConfig
    from transformers.models.modernbert import modeling_modernbert as mb

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 50, 32, generator=g) for _ in range(3))
    config = ModernBertConfig(hidden_size=128, num_attention_heads=4)
    rope = mb.ModernBertRotaryEmbedding(config)
    for layer_type, base in (("full_attention", 160000.0), ("sliding_attention", 10000.0)):
        cos, sin = rope(q, torch.arange(50)[None].expand(2, -1), layer_type)
        qr, kr = mb.apply_rotary_pos_emb(q, k, cos, sin)
        want = torch.nn.functional.scaled_dot_product_attention(qr, kr, v)
        got = fastbert.ops.attention(q, k, v, backend="torch", rotary_base=base)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rotary_errors():
    q = torch.randn(1, 2, 8, 7)
    with pytest.raises(ValueError, match="rotary embeddings need an even head_dim, got 7"):
        fastbert.ops.attention(q, q, q, rotary_base=10000.0, backend="torch")
    q = torch.randn(1, 2, 8, 16)
    for bad in (0.0, -5.0, float("inf"), 1.0, True, "10000"):
        with pytest.raises(ValueError, match="rotary_base must be a finite number > 1"):
            fastbert.ops.attention(q, q, q, rotary_base=bad, backend="torch")
