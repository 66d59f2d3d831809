"""The one error bound of the kernel tests (STYLE.md lesson 4), and running a function forward and
backward on fresh leaves."""
import torch

from fastbert.selfcheck import bound_check, with_grads


def assert_within_bound(name, out, torch_out, ref64, dtype):
    """err(kernel, fp64 ref) <= 2 * err(torch in the same dtype, fp64 ref) + ATOL[dtype] * scale."""
    assert out.shape == ref64.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref64.shape)}"
    assert out.dtype == torch_out.dtype, f"{name}: dtype {out.dtype}, torch gives {torch_out.dtype}"
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    ok, err, bound = bound_check(out, torch_out, ref64, dtype)
    assert ok, f"{name}: err {err:.3e} > bound {bound:.3e}"


def run_with_grads(fn, inputs, grad_out):
    """Call fn(*inputs) on fresh leaf copies; return (output, [grad of each input])."""
    out, *grads = with_grads(fn, inputs, grad_out)
    return out, grads
