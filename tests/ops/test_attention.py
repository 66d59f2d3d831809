"""fastbert.ops.attention / varlen_attention / unpad / pad on every backend against the fp64 reference.

Outputs and dq, dk, dv are compared at real-token positions with the bound of STYLE.md lesson 4;
everything else must be finite. Dropout is checked with the keep-mask each backend reports, which
must also be the reference's counter-based mask bit for bit.
"""
import sys

import pytest
import torch

import fastbert
from fastbert import reference
from tests.helpers.attention import mixed_mask, pack, qkv, run, varlen_lengths
from tests.helpers.backends import device_for, dtypes_for
from tests.helpers.bounds import assert_within_bound

# The interpreter is slow: the triton backend gets short sequences; the others every length asked.
SEQS_SMALL = [1, 7, 33, 64]
SEQS_LARGE = [97, 128, 200]
HEAD_DIMS = [32, 64, 128]


def seqs_for(backend):
    return SEQS_SMALL if backend == "triton" else SEQS_SMALL + SEQS_LARGE


def check_attention(backend, batch, heads, seq, head_dim, dtype, dropout_p, seed, left=False):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(seed)
    q, k, v = qkv((batch, heads, seq, head_dim), dtype, dev, g)
    dout = torch.randn(batch, heads, seq, head_dim, generator=g).to(dev, dtype)
    mask = mixed_mask(batch, seq, g, left).to(dev)
    seed_ = 1234 + seed
    with torch.no_grad():
        _, keep = fastbert.ops.attention(
            q, k, v, mask, dropout_p=dropout_p, seed=seed_, backend=backend, return_dropout_mask=True
        )
    if dropout_p > 0:
        want = reference.attention_keep_mask(seed_, batch, heads, seq, seq, dropout_p, reference.mask_starts(mask), dev)
        real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
        assert torch.equal(keep & real, want & real), f"{backend}: dropout mask differs from the reference's"

    def op(q_, k_, v_):
        return fastbert.ops.attention(q_, k_, v_, mask, dropout_p=dropout_p, seed=seed_, backend=backend)

    def ref(q_, k_, v_):
        return reference.attention(q_, k_, v_, mask, dropout_p, keep_mask=keep)

    out, grads = run(op, [q, k, v], dout)
    pt, pt_grads = run(ref, [q, k, v], dout)
    r64, r_grads = run(ref, [q.double(), k.double(), v.double()], dout.double())
    real = mask.bool()[:, None, :, None].expand_as(out)
    tag = f"{backend} b{batch} h{heads} s{seq} d{head_dim} {dtype} p{dropout_p}{' left' if left else ''}"
    for name, a, b, c in [("out", out, pt, r64)] + [(n, *t) for n, t in zip(("dq", "dk", "dv"), zip(grads, pt_grads, r_grads))]:
        assert torch.isfinite(a).all(), f"{tag} {name}: non-finite values"
        assert_within_bound(f"{tag} {name}", a[real], b[real], c[real], dtype)


@pytest.mark.slow_with("triton")
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_attention_matches_reference(backend, dropout_p):
    for i, seq in enumerate(seqs_for(backend)):
        head_dim = HEAD_DIMS[i % len(HEAD_DIMS)]
        for dtype in dtypes_for(backend):
            check_attention(backend, 4, 2, seq, head_dim, dtype, dropout_p, seed=i)


@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128])
def test_attention_head_dims(backend, head_dim):
    check_attention(backend, 3, 2, 33, head_dim, torch.float32, 0.0, seed=head_dim)


@pytest.mark.parametrize("head_dim", [1, 7, 20, 48])
def test_attention_any_head_dim(backend, head_dim):
    # head dims that are not a multiple of the vector width: the tails of rows are read and written
    # with masked loads (the triton kernels take only the head dims above)
    if backend == "triton":
        pytest.skip("the triton backend takes head_dim 16, 32, 64, 80, 96, 128; its error is tested below")
    check_attention(backend, 3, 2, 37, head_dim, torch.float32, 0.1, seed=head_dim)
    check_attention(backend, 3, 2, 19, head_dim, torch.bfloat16, 0.0, seed=head_dim)


def test_bf16_products_both_ways():
    """Where the CPU multiplies bf16 natively, the cpp attention's bf16 forward can run a sequence's
    two products on the BLAS's bf16 GEMM (the weights rounded to bf16) or in fp32, the first from a
    length timed here: both against fp64 within the bf16 bound, with holes, left padding, dropout,
    rotary positions and local windows, and the timed length set again after a forced one."""
    from tests.ops.test_attention_local import check_local

    ext = fastbert.backend.cpp_extension()
    if ext is None or not ext.attention_bf16_available():
        pytest.skip("no native bf16 GEMM at this CPU's kernel level: the fp32 products, tested above, are the only path")
    ops_attention = sys.modules["fastbert.ops.attention"]
    chosen = ops_attention.bf16_min_len(ext)
    assert chosen == -1 or chosen in ops_attention.BF16_LENGTHS
    for on in (False, True):
        with ops_attention.forced_bf16_products(on):
            check_attention("cpp", 4, 2, 97, 64, torch.bfloat16, 0.0, seed=1)
            check_attention("cpp", 3, 2, 200, 64, torch.bfloat16, 0.1, seed=2, left=True)
            check_local("cpp", 3, 2, 300, 64, torch.bfloat16, 40, seed=3, rotary_base=10000.0, holes=True)
            assert ext.attention_bf16_min_len() == (0 if on else -1)
    fastbert.ops.attention(*qkv((1, 1, 3, 64), torch.bfloat16, "cpu", torch.Generator()), backend="cpp")
    assert ext.attention_bf16_min_len() == chosen


def test_attention_left_padding_and_dropout(backend):
    check_attention(backend, 4, 2, 33, 64, torch.float32, 0.2, seed=5, left=True)


def test_attention_without_mask(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv((2, 3, 17, 32), torch.float32, dev, g)
    out = fastbert.ops.attention(q, k, v, backend=backend)
    ref = reference.attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_kind", ["zeros", "one_token", "last_token"])
def test_attention_never_nan(backend, mask_kind):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(11)
    q, k, v = qkv((2, 2, 9, 32), torch.float32, dev, g)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    if mask_kind == "one_token":
        mask[:, 0] = True
    elif mask_kind == "last_token":
        mask[:, -1] = True
    mask = mask.to(dev)
    for p in (0.0, 0.5):
        out, grads = run(
            lambda *t, p=p: fastbert.ops.attention(*t, mask, dropout_p=p, seed=1, backend=backend),
            [q, k, v], torch.randn(q.shape, generator=g).to(dev),
        )
        for name, t in zip(("out", "dq", "dk", "dv"), [out] + grads):
            assert torch.isfinite(t).all(), f"{backend} {mask_kind} p={p}: {name} has NaN/inf"
        if mask_kind == "zeros":
            assert out.abs().max() == 0 and all(t.abs().max() == 0 for t in grads)


@pytest.mark.slow_with("triton")
def test_varlen_agrees_with_padded(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(21)
    batch, heads, seq, d = 5, 2, 40, 64
    for dtype in dtypes_for(backend):
        q, k, v = qkv((batch, heads, seq, d), dtype, dev, g)
        mask = mixed_mask(batch, seq, g).to(dev)
        dout = torch.randn(batch, heads, seq, d, generator=g).to(dev, dtype)
        packed_in = [pack(t, mask) for t in (q, k, v)]
        _, indices, cu_seqlens, max_seqlen = fastbert.ops.unpad(mask[..., None], mask)
        for p in (0.0, 0.1):
            out, grads = run(
                lambda *t, m=mask, p=p: fastbert.ops.attention(*t, m, dropout_p=p, seed=7, backend=backend), [q, k, v], dout
            )
            vout, vgrads = run(
                lambda *t, cu=cu_seqlens, n=max_seqlen, p=p: fastbert.ops.varlen_attention(
                    *t, cu, n, dropout_p=p, seed=7, backend=backend),
                packed_in, pack(dout, mask),
            )
            tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(vout, pack(out, mask), **tol)
            for a, b in zip(vgrads, grads):
                torch.testing.assert_close(a, pack(b, mask), **tol)


@pytest.mark.slow_with("triton")
def test_varlen_matches_reference(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(4)
    lengths, cu_seqlens, max_seqlen = varlen_lengths(backend, dev)
    total = sum(lengths)
    for dtype in dtypes_for(backend):
        q, k, v = qkv((total, 3, 64), dtype, dev, g)
        dout = torch.randn(total, 3, 64, generator=g).to(dev, dtype)
        for p in (0.0, 0.1):
            with torch.no_grad():
                _, keep = fastbert.ops.varlen_attention(
                    q, k, v, cu_seqlens, max_seqlen, dropout_p=p, seed=9, backend=backend, return_dropout_mask=True
                )
            if p > 0:
                want = reference.attention_keep_mask(9, len(lengths), 3, max_seqlen, max_seqlen, p, device=dev)
                for b, n in enumerate(lengths):
                    assert torch.equal(keep[b, :, :n, :n], want[b, :, :n, :n]), f"{backend}: varlen dropout mask, seq {b}"

            def op(*t, p=p):
                return fastbert.ops.varlen_attention(*t, cu_seqlens, max_seqlen, dropout_p=p, seed=9, backend=backend)

            def ref(*t, p=p, keep=keep):
                return reference.varlen_attention(*t, cu_seqlens, p, keep_mask=keep)

            out, grads = run(op, [q, k, v], dout)
            pt, pt_grads = run(ref, [q, k, v], dout)
            r64, r_grads = run(ref, [q.double(), k.double(), v.double()], dout.double())
            tag = f"{backend} varlen {dtype} p{p}"
            grad_rows = [(n, *t) for n, t in zip(("dq", "dk", "dv"), zip(grads, pt_grads, r_grads))]
            for name, a, b, c in [("out", out, pt, r64)] + grad_rows:
                assert_within_bound(f"{tag} {name}", a, b, c, dtype)


def test_attention_dropout_is_seeded(backend):
    dev = device_for(backend)
    g = torch.Generator().manual_seed(8)
    q, k, v = qkv((2, 2, 16, 32), torch.float32, dev, g)
    a = fastbert.ops.attention(q, k, v, dropout_p=0.3, seed=5, backend=backend)
    b = fastbert.ops.attention(q, k, v, dropout_p=0.3, seed=5, backend=backend)
    c = fastbert.ops.attention(q, k, v, dropout_p=0.3, seed=6, backend=backend)
    assert torch.equal(a, b) and not torch.equal(a, c)
    _, keep = fastbert.ops.attention(q, k, v, dropout_p=0.3, seed=5, backend=backend, return_dropout_mask=True)
    assert abs(keep.float().mean().item() - 0.7) < 0.05


# ---------------------------------------------------------------------------------------------
# bad input


def test_attention_errors():
    q = torch.randn(2, 3, 5, 32)
    with pytest.raises(ValueError, match="k has shape"):
        fastbert.ops.attention(q, torch.randn(2, 3, 6, 32), q)
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        fastbert.ops.attention(q, q, q, torch.ones(2, 6))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        fastbert.ops.attention(q, q, q, torch.ones(2, 1, 1, 5))
    with pytest.raises(TypeError, match="dtype"):
        fastbert.ops.attention(q, q.half(), q)
    with pytest.raises(ValueError, match="head_dim 512"):
        big = torch.randn(1, 1, 2, 512)
        fastbert.ops.attention(big, big, big)
    with pytest.raises(ValueError, match="dropout_p"):
        fastbert.ops.attention(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="q must be"):
        fastbert.ops.attention(q[0], q[0], q[0])


@pytest.mark.triton
def test_attention_triton_head_dim_error():
    pytest.importorskip("triton")
    from fastbert import backend as fb

    if not (torch.cuda.is_available() or fb.triton_interpreting()):
        pytest.skip("triton cannot run here")
    q = torch.randn(1, 1, 4, 48, device=device_for("triton"))
    with pytest.raises(ValueError, match="head_dim 48 is not supported by the 'triton' backend"):
        fastbert.ops.attention(q, q, q, backend="triton")


def test_varlen_errors():
    q = torch.randn(10, 2, 32)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(TypeError, match="int32"):
        fastbert.ops.varlen_attention(q, q, q, cu.long(), 6)
    with pytest.raises(ValueError, match="non-decreasing"):
        fastbert.ops.varlen_attention(q, q, q, torch.tensor([0, 6, 4, 10], dtype=torch.int32), 6)
    with pytest.raises(ValueError, match="max_seqlen is 5"):
        fastbert.ops.varlen_attention(q, q, q, cu, 5)
    with pytest.raises(ValueError, match="end at total_tokens"):
        fastbert.ops.varlen_attention(q, q, q, torch.tensor([0, 4, 9], dtype=torch.int32), 6)
    with pytest.raises(ValueError, match="k has shape"):
        fastbert.ops.varlen_attention(q, q[:9], q, cu, 6)


# ---------------------------------------------------------------------------------------------
# unpad / pad


def test_unpad_pad_round_trip_and_gradients():
    g = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 1]])
    hidden = torch.randn(4, 5, 3, 2, generator=g, requires_grad=True)
    packed, indices, cu_seqlens, max_seqlen = fastbert.ops.unpad(hidden, mask)
    assert packed.shape == (11, 3, 2) and indices.dtype == torch.int64
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 3, 8, 11] and max_seqlen == 5
    assert torch.equal(packed, hidden.detach().reshape(20, 3, 2)[mask.flatten().bool()])
    back = fastbert.ops.pad(packed, indices, 4, 5)
    assert torch.equal(back, hidden.detach() * mask[..., None, None])
    w = torch.randn(back.shape, generator=g)
    (back * w).sum().backward()
    assert torch.equal(hidden.grad, w * mask[..., None, None])


def test_unpad_errors():
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        fastbert.ops.unpad(torch.randn(2, 3, 4), torch.ones(2, 3, 1))
    with pytest.raises(ValueError, match="hidden must be"):
        fastbert.ops.unpad(torch.randn(2, 4, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="rows"):
        fastbert.ops.pad(torch.randn(3, 4), torch.arange(2), 1, 3)


def test_inference_gives_the_bits_of_the_training_forward(backend):
    """Under no_grad the fused backends keep no log-sum-exp (nothing will read it): the outputs are
    still those of the forward that keeps it for a backward, padded and packed, with dropout, rotary
    tables, a window and a relative bias."""
    dev = device_for(backend)
    g = torch.Generator().manual_seed(12)
    q, k, v = qkv((3, 2, 13, 32), torch.float32, dev, g)
    mask = mixed_mask(3, 13, g).to(dev)
    rel = torch.randn(2, 2 * 13 - 1, generator=g).to(dev)
    cu, n = torch.tensor([0, 5, 6, 13], dtype=torch.int32, device=dev), 7  # lengths 5, 1, 7
    qp, kp, vp = qkv((13, 2, 32), torch.float32, dev, g)
    for opts in (dict(), dict(dropout_p=0.2, seed=5), dict(rotary_base=10000.0, window=3), dict(relative_bias=rel)):
        with torch.no_grad():
            got = fastbert.ops.attention(q, k, v, mask, backend=backend, **opts)
            got_packed = fastbert.ops.varlen_attention(qp, kp, vp, cu, n, backend=backend, **opts)
        want = fastbert.ops.attention(q.requires_grad_(), k, v, mask, backend=backend, **opts)
        want_packed = fastbert.ops.varlen_attention(qp.requires_grad_(), kp, vp, cu, n, backend=backend, **opts)
        q.requires_grad_(False), qp.requires_grad_(False)
        assert torch.equal(got, want.detach()), sorted(opts)
        assert torch.equal(got_packed, want_packed.detach()), sorted(opts)
