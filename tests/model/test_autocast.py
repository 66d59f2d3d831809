"""Every model class under torch.autocast("cpu", bfloat16), the standard mixed-precision recipe (what
Trainer(bf16=True) does), in training and in inference, against transformers under the same
autocast: fastbert's error against transformers in float64 is at most twice transformers' own
autocast error, plus the bf16 floor (STYLE.md lesson 4), for the outputs, the loss and every
parameter's gradient."""
import copy

import pytest
import torch

from tests.helpers.autocast import BF16, run
from tests.helpers.backends import require
from tests.helpers.bert import HEADS, TINY, batch, labels_for, pair
from tests.helpers.bounds import assert_within_bound


@pytest.mark.parametrize("train", [True, False], ids=["train", "inference"])
@pytest.mark.parametrize("name", HEADS)
def test_bf16_autocast_matches_transformers(name, train):
    require("cpp")
    hm, fm = pair(name, TINY)
    exact = copy.deepcopy(hm).double()
    for m in (hm, fm, exact):
        m.train(train)
    g = torch.Generator().manual_seed(7)
    ids, mask, tt = batch(TINY["vocab_size"], 4, 16, g, pad=name != "BertForQuestionAnswering")
    extra = labels_for(name, fm, ids, mask, g) if train else {}
    if name == "BertForQuestionAnswering" and train:
        extra = dict(start_positions=torch.tensor([1, 4, 20, 3]), end_positions=torch.tensor([2, 9, 3, 15]))
    weights = {}
    ours, ours_p = run(fm, True, ids, mask, tt, extra, weights, autocast=True)
    theirs, theirs_p = run(hm, False, ids, mask, tt, extra, weights, autocast=True)
    ref, ref_p = run(exact, False, ids, mask, tt, extra, weights, autocast=False)
    assert set(ours) == set(theirs), (set(ours), set(theirs))
    for key in ours:
        assert_within_bound(f"{name} autocast {key}", ours[key], theirs[key], ref[key], BF16)
    for pname, p in ours_p.items():
        if theirs_p[pname].grad is None:
            assert p.grad is None or not p.grad.any(), f"{name}: gradient for {pname}, none in transformers"
            continue
        assert p.grad is not None, f"{name}: no gradient for {pname}"
        assert_within_bound(f"{name} autocast grad {pname}", p.grad.float(), theirs_p[pname].grad.float(),
                            ref_p[pname].grad, BF16)


def test_autocast_inference_of_a_bf16_model_keeps_bf16():
    """A model cast to bf16 and run under autocast stays in bf16 between the layers (nothing to promote)."""
    require("cpp")
    _, fm = pair("BertModel", TINY)
    fm.to(BF16)
    ids, mask, tt = batch(TINY["vocab_size"], 3, 9, torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        out = fm(ids, mask, tt)
    assert out.last_hidden_state.dtype == BF16 and torch.isfinite(out.last_hidden_state).all()


def test_mismatched_dtypes_outside_autocast_are_an_error():
    import fastbert

    x, r = torch.randn(4, 8, dtype=BF16), torch.randn(4, 8)
    w, b = torch.ones(8), torch.zeros(8)
    with pytest.raises(TypeError, match="must match"):
        fastbert.ops.add_layer_norm(x, r, w, b)
    with torch.autocast("cpu", dtype=BF16):
        y = fastbert.ops.add_layer_norm(x, r, w, b)
    assert y.dtype == torch.float32
