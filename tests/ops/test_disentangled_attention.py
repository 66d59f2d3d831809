"""fastbert.ops.disentangled_attention (DeBERTa's): the rows its position terms read against
transformers' relative positions, the op against transformers' attention module on the same
projections; the fused kernels against the reference formulation (outputs and the gradients of q,
k, v and both position tables, with the bound of STYLE.md lesson 4, fp64 as the truth) with
padding left, right and with holes, log buckets and none, one term or both, sequences past the
one-block backward, dropout; packed against padded; the thread count; input errors."""
import pytest
import torch

import fastbert
from fastbert import backend as fb_backend
from fastbert import reference
from fastbert.layouts import deberta_position_rows
from fastbert.ops.disentangled_attention import disentangled_attention, position_index, varlen_disentangled_attention
from fastbert.reference.disentangled_attention import disentangled_attention as reference_attention
from fastbert.reference.disentangled_attention import position_rows_matrix
from tests.helpers.attention import holey_mask, mixed_mask, pack, run
from tests.helpers.backends import device_for, dtypes_for, require
from tests.helpers.bounds import assert_within_bound

transformers = pytest.importorskip("transformers")
deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")


@pytest.mark.parametrize("seq,buckets,furthest", [(700, 256, 512), (40, 8, 64), (300, 16, 64), (30, -1, 16)])
def test_position_rows_are_transformers_relative_positions(seq, buckets, furthest):
    x = torch.zeros(1, seq, 4)
    span = buckets if buckets > 0 else furthest
    want = (deberta.build_relative_position(x, x, bucket_size=buckets, max_position=furthest)[0] + span)
    want = want.clamp(0, 2 * span - 1)
    assert torch.equal(position_rows_matrix(seq, buckets, furthest), want)
    assert deberta_position_rows(seq, buckets, furthest).shape == (2 * seq - 1,)


@pytest.mark.parametrize("terms", ["p2c|c2p", "c2p", "p2c"])
def test_against_transformers_attention_module(terms):
    cfg = transformers.DebertaV2Config(hidden_size=32, num_attention_heads=2, relative_attention=True,
                                       position_buckets=8, max_relative_positions=32, pos_att_type=terms,
                                       share_att_key=True, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    torch.manual_seed(0)
    module = deberta.DisentangledSelfAttention(cfg).eval()
    g = torch.Generator().manual_seed(1)
    hidden, rel = torch.randn(2, 21, 32, generator=g), torch.randn(16, 32, generator=g)
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[1, 13:] = 0
    ext = mask[:, None, None, :] * mask[:, None, :, None]
    with torch.no_grad():
        want = module(hidden, ext, rel_embeddings=rel)[0]

        def heads(t):
            return t.view(*t.shape[:-1], 2, 16).transpose(-3, -2)

        q, k, v = heads(module.query_proj(hidden)), heads(module.key_proj(hidden)), heads(module.value_proj(hidden))
        pk, pq = heads(module.key_proj(rel)), heads(module.query_proj(rel))
        got = disentangled_attention(q, k, v, mask, pos_key=pk if "c2p" in terms else None,
                                     pos_query=pq if "p2c" in terms else None, position_buckets=8,
                                     max_relative_positions=32)
    real = mask.bool()
    torch.testing.assert_close(got.transpose(1, 2).reshape(2, 21, 32)[real], want[real], atol=1e-6, rtol=1e-5)


def test_dropout_is_a_function_of_the_seed():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=g) for _ in range(3))
    pk = torch.randn(2, 16, 8, generator=g)
    kw = dict(pos_key=pk, position_buckets=8, max_relative_positions=16)
    a, b = (disentangled_attention(q, k, v, dropout_p=0.3, seed=7, **kw) for _ in range(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, disentangled_attention(q, k, v, dropout_p=0.3, seed=8, **kw))
    assert not torch.equal(a, disentangled_attention(q, k, v, **kw))


def test_input_errors():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"pos_key must be \[heads, 2 span, head_dim\] = \(2, 16, 8\)"):
        disentangled_attention(q, q, q, pos_key=torch.randn(2, 10, 8), position_buckets=8)
    with pytest.raises(ValueError, match="attention_mask must be"):
        disentangled_attention(q, q, q, torch.ones(1, 4))
    with pytest.raises(ValueError, match="q, k and v must be"):
        disentangled_attention(q, q[..., :4], q)
    with pytest.raises(ValueError, match="unknown backend"):
        disentangled_attention(q, q, q, backend="cuda")


# the backends whose kernels read the terms ("torch" runs the reference formulation)
FUSED = ["cpp", pytest.param("triton", marks=pytest.mark.triton)]


def fused_dtypes(backend):
    # the Triton kernels take 16-bit inputs (the interpreter: float16 only, it has no bf16 product)
    if backend == "triton":
        return [torch.float16, torch.bfloat16] if torch.cuda.is_available() else [torch.float16]
    return dtypes_for(backend)


def tables(heads, span, d, terms, g):
    pk = torch.randn(heads, 2 * span, d, generator=g) if "c2p" in terms else None
    pq = torch.randn(heads, 2 * span, d, generator=g) if "p2c" in terms else None
    return pk, pq


def check_fused(backend, batch, heads, seq, d, dtype, seed, *, terms="c2p|p2c", buckets=16, furthest=64, mask="mixed",
                dropout_p=0.0):
    """The op on `backend` against the reference formulation in dtype and in fp64: the output and
    the gradients of q, k, v and of each position table given, at the real positions."""
    dev = device_for(backend)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq, d, generator=g).to(dev, dtype) for _ in range(3))
    pk, pq = tables(heads, buckets if buckets > 0 else furthest, d, terms, g)
    m = {"mixed": mixed_mask(batch, seq, g), "left": mixed_mask(batch, seq, g, left=True),
         "holes": holey_mask(batch, seq, g)}[mask].to(dev)
    real = m.bool()[:, None, :, None]
    dout = torch.randn(batch, heads, seq, d, generator=g).to(dev, dtype) * real  # padded queries pass no gradient
    keep = reference.attention_keep_mask(5, batch, heads, seq, seq, dropout_p, reference.mask_starts(m), dev)
    given = [t.to(dev, dtype) for t in (pk, pq) if t is not None]
    kw = dict(position_buckets=buckets, max_relative_positions=furthest)

    def split(t):
        rest = list(t)
        return (rest.pop(0) if pk is not None else None), (rest.pop(0) if pq is not None else None)

    def op(q_, k_, v_, *t):
        key, query = split(t)
        return disentangled_attention(q_, k_, v_, m, pos_key=key, pos_query=query, dropout_p=dropout_p, seed=5,
                                      backend=backend, **kw)

    def ref(q_, k_, v_, *t):
        key, query = split(t)
        return reference_attention(q_, k_, v_, m, key, query, keep_mask=keep, dropout_p=dropout_p, **kw)[0]

    inputs = [q, k, v, *given]
    got, same, r64 = run(op, inputs, dout), run(ref, inputs, dout), run(ref, [t.double() for t in inputs], dout.double())
    names = ["out", "dq", "dk", "dv"] + ["dpos_key"] * (pk is not None) + ["dpos_query"] * (pq is not None)
    tag = f"{backend} {terms} b{buckets} s{seq} d{d} {mask} p{dropout_p} {dtype}"
    for i, name in enumerate(names):
        a, b, c = ((r[0] if i == 0 else r[1][i - 1]) for r in (got, same, r64))
        assert torch.isfinite(a).all(), f"{tag} {name}: non-finite values"
        if i < 4:
            a, b, c = (x[real.expand_as(x)] for x in (a, b, c))
        assert_within_bound(f"{tag} {name}", a, b, c, dtype)


@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("terms", ["c2p|p2c", "c2p", "p2c"])
def test_fused_matches_reference(backend, terms):
    require(backend)
    for i, dtype in enumerate(fused_dtypes(backend)):
        # distances inside the buckets' linear part and past it (log buckets), and no buckets
        for j, d in enumerate((16, 32, 64)[i:] if backend == "triton" else (16, 32, 64)[i:i + 1]):
            check_fused(backend, 4, 2, 37, d, dtype, seed=i + j, terms=terms)
        check_fused(backend, 3, 2, 21, 16, dtype, seed=10 + i, terms=terms, buckets=-1, furthest=8)


@pytest.mark.parametrize("backend", FUSED)
def test_fused_with_left_padding_holes_and_dropout(backend):
    require(backend)
    dtype = fused_dtypes(backend)[0]
    check_fused(backend, 4, 2, 29, 32, dtype, seed=3, mask="left", dropout_p=0.2)
    check_fused(backend, 4, 2, 29, 32, dtype, seed=4, mask="holes")
    check_fused(backend, 3, 2, 23, 16, torch.float16, seed=5, mask="holes", dropout_p=0.1, terms="p2c")
    # more than one tile of queries and of keys (the Triton kernels' tiles are 16 and 32)
    check_fused(backend, 2, 2, 70, 32, torch.float16, seed=11, mask="holes", dropout_p=0.1)
    check_fused(backend, 2, 2, 70, 64, torch.float16, seed=12, mask="left", terms="c2p")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpp"])  # the Triton kernels' tiles are met by 70 tokens (the interpreter is slow)
def test_fused_on_long_sequences(backend):
    # past 256 keys the backward takes its key blocks in two passes; deberta-v3's own buckets
    require(backend)
    check_fused(backend, 2, 2, 300, 16, torch.float32, seed=6, buckets=256, furthest=512)
    check_fused(backend, 2, 1, 600, 16, torch.float32, seed=7, buckets=256, furthest=512, dropout_p=0.1)


@pytest.mark.parametrize("backend", FUSED)
def test_packed_agrees_with_padded_and_reference(backend):
    # outputs and every gradient (the packed rows' lse and delta are laid out per token)
    require(backend)
    dev = device_for(backend)
    g = torch.Generator().manual_seed(8)
    batch, heads, seq, d = 5, 2, 40, 32
    dtype = fused_dtypes(backend)[0]
    q, k, v = (torch.randn(batch, heads, seq, d, generator=g).to(dev, dtype) for _ in range(3))
    pk, pq = (t.to(dev, dtype) for t in tables(heads, 16, d, "c2p|p2c", g))
    mask = mixed_mask(batch, seq, g).to(dev)
    _, _, cu, n = fastbert.ops.unpad(mask[..., None], mask)
    kw = dict(position_buckets=16, max_relative_positions=64, dropout_p=0.2, seed=3)
    dout = pack(torch.randn(batch, heads, seq, d, generator=g).to(dev, dtype), mask)

    def padded(q_, k_, v_, pk_, pq_):
        return pack(disentangled_attention(q_, k_, v_, mask, pos_key=pk_, pos_query=pq_, backend=backend, **kw), mask)

    def packed(q_, k_, v_, pk_, pq_, on=backend, longest=n + 3):
        return varlen_disentangled_attention(*(pack(t, mask) for t in (q_, k_, v_)), cu, longest, pos_key=pk_,
                                             pos_query=pq_, backend=on, **kw)

    exact = dtype == torch.float32
    inputs = [q, k, v, pk, pq]
    got, same, by_torch = (run(f, inputs, dout) for f in (packed, padded, lambda *t: packed(*t, on="torch", longest=n)))
    for i, (a, b, c) in enumerate(zip([got[0], *got[1]], [same[0], *same[1]], [by_torch[0], *by_torch[1]])):
        a, b, c = (x.float() for x in (a, b, c))
        torch.testing.assert_close(a, b, atol=1e-5 if exact else 2e-3, rtol=1e-4 if exact else 2e-3, msg=f"input {i}")
        torch.testing.assert_close(a, c, atol=5e-5 if exact else 1e-2, rtol=1e-4 if exact else 1e-2, msg=f"input {i}")


@pytest.mark.parametrize("backend", ["torch", *FUSED])
@pytest.mark.parametrize("buckets,furthest", [(256, 512), (8, 64)])
def test_tables_of_the_reached_rows_alone(backend, buckets, furthest):
    # a model projects only the rows [lo, hi) the batch's lengths reach: the op takes them as they
    # are, with the outputs and gradients of the whole tables (the rest of a whole table's gradient
    # is zero), padded and packed; lengths past 2 x 8 buckets reach log buckets, 30 < 128 do not
    require(backend)
    dev = device_for(backend)
    dtype = fused_dtypes(backend)[0] if backend != "torch" else torch.float32
    g = torch.Generator().manual_seed(13)
    batch, heads, seq, d = 3, 2, 30, 16
    q, k, v = (torch.randn(batch, heads, seq, d, generator=g).to(dev, dtype) for _ in range(3))
    span = buckets
    pk, pq = (torch.randn(heads, 2 * span, d, generator=g).to(dev, dtype) for _ in range(2))
    mask = mixed_mask(batch, seq, g).to(dev)
    _, _, cu, n = fastbert.ops.unpad(mask[..., None], mask)
    dout = torch.randn(batch, heads, seq, d, generator=g).to(dev, dtype) * mask.bool()[:, None, :, None]
    kw = dict(position_buckets=buckets, max_relative_positions=furthest, backend=backend)
    for longest in (seq, n):
        _, lo, hi = position_index(longest, buckets, furthest)
        assert 0 < hi - lo < 2 * span

        def padded(q_, k_, v_, pk_, pq_):
            return disentangled_attention(q_, k_, v_, mask, pos_key=pk_, pos_query=pq_, **kw)

        def packed(q_, k_, v_, pk_, pq_, longest=longest):
            return varlen_disentangled_attention(*(pack(t, mask) for t in (q_, k_, v_)), cu, longest, pos_key=pk_,
                                                 pos_query=pq_, **kw)

        f = padded if longest == seq else packed
        out = dout if longest == seq else pack(dout, mask)
        whole = run(f, [q, k, v, pk, pq], out)
        cut = run(f, [q, k, v, pk[:, lo:hi].contiguous(), pq[:, lo:hi].contiguous()], out)
        assert torch.equal(whole[0], cut[0]), f"{backend} {longest}: output"
        for i, name in enumerate(["dq", "dk", "dv"]):
            assert torch.equal(whole[1][i], cut[1][i]), f"{backend} {longest}: {name}"
        for i, name in ((3, "dpos_key"), (4, "dpos_query")):
            assert torch.equal(whole[1][i][:, lo:hi], cut[1][i]), f"{backend} {longest}: {name}"
            assert not whole[1][i][:, :lo].any() and not whole[1][i][:, hi:].any(), f"{backend}: {name} outside"
    _, lo, hi = position_index(seq, buckets, furthest)
    with pytest.raises(ValueError, match=rf"pos_query must be .* \(or the {hi - lo} rows \[{lo}, {hi}\)"):
        disentangled_attention(q, k, v, pos_query=pq[:, lo:hi - 1], position_buckets=buckets,
                               max_relative_positions=furthest)


@pytest.mark.parametrize("backend", ["cpp"])
def test_fused_does_not_depend_on_the_thread_count(backend):
    require(backend)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(6, 2, 33, 16, generator=g, requires_grad=True) for _ in range(3))
    pk, pq = (t.requires_grad_() for t in tables(2, 16, 16, "c2p|p2c", g))
    mask = mixed_mask(6, 33, g)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = disentangled_attention(q, k, v, mask, pos_key=pk, pos_query=pq, position_buckets=16,
                                         max_relative_positions=64, backend=backend)
            results.append([out, *torch.autograd.grad(out, [q, k, v, pk, pq], torch.ones_like(out))])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.triton
def test_what_the_triton_kernels_do_not_take_runs_the_formulation():
    # fp32 and head dims past 64 spill registers in the kernels: the op runs its PyTorch formulation
    require("triton")
    takes = fb_backend.impl("triton", "disentangled_attention").disentangled_takes
    assert takes(torch.float16, 64) and takes(torch.bfloat16, 32)
    assert not takes(torch.float32, 64) and not takes(torch.float16, 128) and not takes(torch.float16, 48)
    dev = device_for("triton")
    g = torch.Generator().manual_seed(13)
    for dtype, d in ((torch.float32, 16), (torch.float16, 128)):
        q = torch.randn(2, 2, 9, d, generator=g).to(dev, dtype)
        pk = torch.randn(2, 16, d, generator=g).to(dev, dtype)
        got = disentangled_attention(q, q, q, pos_key=pk, position_buckets=8, backend="triton")
        want = disentangled_attention(q, q, q, pos_key=pk, position_buckets=8, backend="torch")
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_the_extension_checks_its_position_index():
    require("cpp")
    ext = fb_backend.cpp_extension()
    q = torch.randn(1, 2, 5, 8)
    pk = torch.randn(2, 9, 8)
    good = torch.arange(9, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"pos_index must hold non-decreasing rows in \[0, 9\), got 9"):
        ext.disentangled_attention_forward(q, q, q, None, None, pk, None, good + 1, 0.1, 0.0, 0)
    with pytest.raises(RuntimeError, match="non-decreasing"):
        ext.disentangled_attention_forward(q, q, q, None, None, pk, None, good.flip(0), 0.1, 0.0, 0)
    with pytest.raises(RuntimeError, match=r"pos_index must be a contiguous int32 CPU tensor \[2n - 1\], n >= 5"):
        ext.disentangled_attention_forward(q, q, q, None, None, pk, None, good[:7], 0.1, 0.0, 0)
    with pytest.raises(RuntimeError, match="pos_key, pos_query or both"):
        ext.disentangled_attention_forward(q, q, q, None, None, None, None, good, 0.1, 0.0, 0)
