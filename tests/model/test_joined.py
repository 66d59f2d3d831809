"""Parameters joined into one tensor (fastbert.model.joined): after every way of changing a part,
views_of says whether the parts are still the joined tensor's slices, and Unmoved (the check a model
runs at every forward, made when views_of last held) gives the same answer."""
import pytest
import torch
from torch import nn

from fastbert.model.joined import Unmoved, share_storage, views_of


def _parts():
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(4, 3)) for _ in range(3)]
    fused = share_storage(params)
    return fused, params


def _write_in_place(params):
    with torch.no_grad():
        params[1].mul_(2)


def _copy(params):
    with torch.no_grad():
        params[2].copy_(torch.ones(4, 3))


def _new_memory(params):
    params[0].data = params[0].data.clone()


def _same_address_fewer_rows(params):
    params[1].data = params[1].data[:2]


def _same_address_other_dtype(params):
    params[2].requires_grad_(False)  # (a tensor that takes a gradient must stay floating point)
    params[2].data = params[2].data.view(torch.int32)


def _same_address_transposed(params):
    params[0].data = params[0].data.view(3, 4)


def _to_float64(params):
    params[1].data = params[1].data.to(torch.float64)


def _swap(params):
    torch.utils.swap_tensors(params[0], nn.Parameter(torch.randn(4, 3)))


HOLDS = [_write_in_place, _copy]
BREAKS = [_new_memory, _same_address_fewer_rows, _same_address_other_dtype, _same_address_transposed, _to_float64,
          _swap]


@pytest.mark.parametrize("change", HOLDS + BREAKS, ids=[c.__name__.strip("_") for c in HOLDS + BREAKS])
def test_unmoved_answers_as_views_of(change):
    fused, params = _parts()
    assert views_of(fused, params)
    unmoved = Unmoved(params)
    assert unmoved()
    change(params)
    assert views_of(fused, params) == (change in HOLDS)
    assert unmoved() == (change in HOLDS)
    if change in HOLDS:  # and the joined tensor holds the written values
        assert torch.equal(fused, torch.cat([p.detach() for p in params]))
