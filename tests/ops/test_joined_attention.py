"""A training layer's attention on its joined QKV projection (fastbert.ops.attention.joined_attention,
the Triton route): the same context and the same gradients, bit for bit, as splitting qkv into
q, k, v for attention / varlen_attention (whose results the op tests hold to the reference), packed
and padded, with dropout, rotary tables and a window (ModernBERT's layers), and a relative bias
(MPNet's); and the launchers' grads= and empty_together under it."""
import pytest
import torch

from fastbert import ops
from fastbert.kernels import empty_parts, empty_together, outputs_apart
from fastbert.ops.attention import joined_attention
from tests.helpers.backends import device_for, require

pytestmark = pytest.mark.triton

HEADS, D = 2, 16
WIDTH = HEADS * D


@pytest.fixture(autouse=True)
def _triton():
    require("triton")


def _inputs(packed: bool, dtype, seed=0):
    dev = device_for("triton")
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 9, 3]
    batch, seq = len(lengths), max(lengths)
    mask = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]
    if packed:
        rows = sum(lengths)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        shape, layout = (rows, WIDTH), dict(mask=None, packed=(cu, seq))
    else:
        shape, layout = (batch, seq, WIDTH), dict(mask=mask.to(dev), packed=None)
    qkv = torch.randn(*shape[:-1], 3 * WIDTH, generator=g).to(dev, dtype).requires_grad_()
    grad = torch.randn(shape, generator=g).to(dev, dtype)
    return qkv, shape, layout, grad


def _split(qkv, shape, layout, **opts):
    # what a layer did before: q, k, v views (autograd stacks their gradients), the public ops
    if layout["packed"] is not None:
        q, k, v = qkv.view(-1, 3, HEADS, D).unbind(1)
        cu, n = layout["packed"]
        return ops.varlen_attention(q, k, v, cu, n, backend="triton", **opts).reshape(shape)
    q, k, v = qkv.view(shape[0], shape[1], 3, HEADS, D).permute(2, 0, 3, 1, 4).unbind(0)
    out = ops.attention(q, k, v, layout["mask"], backend="triton", **opts)
    return out.transpose(1, 2).reshape(shape)


def _both(packed, dtype, rel=None, **opts):
    qkv, shape, layout, grad = _inputs(packed, dtype)
    leaves = [qkv] + ([rel] if rel is not None else [])
    got = joined_attention(qkv, shape, HEADS, layout["mask"], layout["packed"], backend="triton", relative_bias=rel,
                           **opts)
    assert got is not None, "the joined route did not run"
    got_grads = torch.autograd.grad(got, leaves, grad)
    want = _split(qkv, shape, layout, relative_bias=rel, **{k: v for k, v in opts.items()})
    want_grads = torch.autograd.grad(want, leaves, grad)
    return (got, *got_grads), (want, *want_grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_joined_is_the_split_route_bit_for_bit(packed, dtype):
    got, want = _both(packed, dtype, dropout_p=0.25, seed=1234)
    for name, a, b in zip(("context", "dqkv"), got, want):
        assert a.shape == b.shape and torch.equal(a, b), name


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_joined_with_rotary_and_a_window(packed):
    got, want = _both(packed, torch.float32, dropout_p=0.0, seed=None, rotary_base=10000.0, window=2)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_joined_with_a_relative_bias(packed):
    g = torch.Generator().manual_seed(5)
    rel = torch.randn(HEADS, 2 * 9 - 1, generator=g).to(device_for("triton")).requires_grad_()
    got, want = _both(packed, torch.float32, rel=rel, dropout_p=0.0, seed=None)
    for name, a, b in zip(("context", "dqkv", "drel"), got, want):
        assert torch.equal(a, b), name


def test_joined_runs_only_where_it_can():
    qkv, shape, layout, _ = _inputs(True, torch.float32)
    args = (qkv, shape, HEADS, layout["mask"], layout["packed"])
    opts = dict(dropout_p=0.0, seed=None)
    assert joined_attention(*args, backend="torch", **opts) is None
    assert joined_attention(qkv.detach(), *args[1:], backend="triton", **opts) is None  # no gradient to come
    with pytest.raises(ValueError, match="dropout_p"):
        joined_attention(*args, backend="triton", dropout_p=1.5, seed=None)


@pytest.mark.parametrize("shape", [(3, 8), (3, 5), (7,)])
def test_empty_together_gives_aligned_independent_parts(shape):
    parts = empty_together(3, shape, torch.float16, "cpu")
    assert len(parts) == 3 and all(tuple(p.shape) == shape for p in parts)
    base = parts[0].untyped_storage().data_ptr()  # the allocator's alignment (CUDA's: 512 bytes; the CPU's: 64)
    assert all(p.is_contiguous() and (p.data_ptr() - base) % 16 == 0 for p in parts)
    for i, p in enumerate(parts):
        p.fill_(i)
    assert all(torch.all(p == i) for i, p in enumerate(parts)), "the parts overlap"
    assert len({p.untyped_storage().data_ptr() for p in parts}) == 1  # one allocation


def test_empty_parts_gives_aligned_independent_parts_of_any_shape_and_dtype():
    specs = [((3, 5), torch.float16), ((7,), torch.float32), ((2, 0, 4), torch.bfloat16), ((1, 3, 1), torch.float64),
             ((5,), torch.int32)]
    parts = empty_parts(specs, "cpu")
    assert [(tuple(p.shape), p.dtype) for p in parts] == specs
    base = parts[0].untyped_storage().data_ptr()
    assert all(p.is_contiguous() and (p.numel() == 0 or (p.data_ptr() - base) % 256 == 0) for p in parts)
    for i, p in enumerate(parts):
        p.fill_(i + 1)
    assert all(torch.all(p == i + 1) for i, p in enumerate(parts)), "the parts overlap"
    assert len({p.untyped_storage().data_ptr() for p in parts}) == 1  # one allocation
    again = empty_parts(specs, "cpu")  # the layout kept from the first call: the same parts, new memory
    assert [(p.shape, p.stride(), p.storage_offset(), p.dtype) for p in again] == \
        [(p.shape, p.stride(), p.storage_offset(), p.dtype) for p in parts]
    assert again[0].untyped_storage().data_ptr() != base
    listed = empty_parts([([3, 5], torch.float16), ([7], torch.float32)], "cpu")  # shapes as lists: laid out alike
    assert [(tuple(p.shape), p.stride()) for p in listed] == [((3, 5), (5, 1)), ((7,), (1,))]
    with outputs_apart():
        apart = empty_parts(specs, "cpu")
    assert len({p.untyped_storage().data_ptr() for p in apart}) == len(specs)
