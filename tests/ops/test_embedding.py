"""fastbert.ops.embedding against F.embedding: the rows, and the weight gradient with repeated ids
and a padding row, in fp32 and bf16; the gradient's memory is reused from step to step."""
import pytest
import torch
import torch.nn.functional as F

import fastbert
from tests.helpers.backends import require
from tests.helpers.bounds import assert_within_bound, run_with_grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padding_idx", [None, 0, -1])
def test_embedding_matches_f_embedding(dtype, padding_idx):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (4, 33), generator=g)
    ids[:, -3:] = 0
    ids[0, :5] = 99
    w = torch.randn(100, 64, generator=g).to(dtype)
    dy = torch.randn(4, 33, 64, generator=g).to(dtype)

    def fused(w_):
        return fastbert.ops.embedding(ids, w_, padding_idx)

    def ref(w_):
        return F.embedding(ids, w_, padding_idx)

    out, (dw,) = run_with_grads(fused, [w], dy)
    base, (base_dw,) = run_with_grads(ref, [w], dy)
    r64, (r64_dw,) = run_with_grads(ref, [w.double()], dy.double())
    assert torch.equal(out, base)
    assert_within_bound(f"dweight {dtype} {padding_idx}", dw, base_dw, r64_dw, dtype)
    if padding_idx is not None:
        assert not dw[padding_idx].any()


def test_the_weight_gradient_reuses_its_memory():
    require("cpp")
    w = torch.randn(3000, 512, requires_grad=True)  # 5.9 MiB: served by the reusing allocator
    ids = torch.randint(0, 3000, (8, 40))
    ptrs = []
    for _ in range(3):
        fastbert.ops.embedding(ids, w).sum().backward()
        ptrs.append(w.grad.data_ptr())
        w.grad = None
    assert len(set(ptrs)) == 1


def test_without_grad_it_is_f_embedding():
    w = torch.randn(10, 4)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(fastbert.ops.embedding(ids, w), F.embedding(ids, w))
