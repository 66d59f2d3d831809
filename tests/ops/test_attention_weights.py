"""fastbert.ops.attention_weights (the explicit path that returns the probabilities) against the
reference, forward and every gradient; rows with no key to attend to give zeros, never NaN."""
import torch

import fastbert
from fastbert import reference
from tests.helpers.bounds import assert_within_bound, run_with_grads


def _bias(mask):
    return torch.zeros(mask.shape).masked_fill(mask == 0, float("-inf"))[:, None, None, :]


def test_matches_reference_at_real_queries_with_finite_gradients():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q, k, v, dout = (torch.randn(3, 2, 13, 16, generator=g).to(dtype) for _ in range(4))
        mask = torch.ones(3, 13, dtype=torch.long)
        mask[1, 6:] = 0
        mask[2] = 0  # a row with no real key at all
        real = mask.bool()[:, None, :, None]

        def ours(*t, mask=mask, real=real):
            return fastbert.ops.attention_weights(*t, _bias(mask))[0] * real

        def ref(*t, mask=mask, real=real):
            return reference.attention(*t, mask) * real

        out, grads = run_with_grads(ours, [q, k, v], dout)
        pt, pt_grads = run_with_grads(ref, [q, k, v], dout)
        r64, r_grads = run_with_grads(ref, [q.double(), k.double(), v.double()], dout.double())
        for name, a, b, c in [("out", out, pt, r64)] + list(zip(("dq", "dk", "dv"), grads, pt_grads, r_grads)):
            assert_within_bound(f"attention_weights {dtype} {name}", a, b, c, dtype)
        _, probs = fastbert.ops.attention_weights(q, k, v, _bias(mask))
        assert (probs[2] == 0).all() and (probs[1, :, :, 6:] == 0).all()
        torch.testing.assert_close(probs[0].float().sum(-1), torch.ones(2, 13), rtol=1e-2, atol=1e-2)
