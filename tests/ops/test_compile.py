"""torch.compile traces the ops as custom ops: no graph breaks, same results as eager, forward and backward."""
import pytest
import torch

import fastbert
from tests.helpers.backends import device_for


class Tail(torch.nn.Module):
    """BERT's FFN tail on the fused ops: dense -> bias_gelu -> dense -> add_layer_norm."""

    def __init__(self, hidden=64, inter=128, dropout_p=0.0, backend=None):
        super().__init__()
        self.up = torch.nn.Linear(hidden, inter, bias=False)
        self.up_bias = torch.nn.Parameter(torch.randn(inter) * 0.1)
        self.down = torch.nn.Linear(inter, hidden)
        self.ln_w = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.ln_b = torch.nn.Parameter(0.1 * torch.randn(hidden))
        self.dropout_p, self.backend = dropout_p, backend

    def forward(self, x, seed=None):
        h = fastbert.ops.bias_gelu(self.up(x), self.up_bias, backend=self.backend)
        return fastbert.ops.add_layer_norm(
            self.down(h), x, self.ln_w, self.ln_b, dropout_p=self.dropout_p, seed=seed, backend=self.backend
        )


def grads_after(model, x, dy, **kw):
    model.zero_grad()
    xl = x.clone().requires_grad_(True)
    y = model(xl, **kw)
    y.backward(dy)
    return y.detach(), [xl.grad] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(backend, compiler):
    torch.manual_seed(0)
    dev = device_for(backend)
    model = Tail(dropout_p=0.1, backend=backend).to(dev)
    x, dy = torch.randn(3, 5, 64, device=dev), torch.randn(3, 5, 64, device=dev)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=compiler)  # fullgraph: a graph break is an error
    for seed in (11, 12):
        y_e, g_e = grads_after(model, x, dy, seed=seed)
        y_c, g_c = grads_after(compiled, x, dy, seed=seed)
        torch.testing.assert_close(y_c, y_e, atol=1e-5, rtol=1e-5)
        for a, b in zip(g_c, g_e):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_compiled_graphs_hold_the_custom_ops():
    # the AOT-traced forward and backward graphs call the fused ops as single opaque nodes
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from tests.helpers.backends import require

    require("cpp")
    seen = []

    def capture(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    model = Tail(dropout_p=0.1, backend="cpp")
    compiled = torch.compile(model, fullgraph=True, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture))
    compiled(torch.randn(2, 64, requires_grad=True), seed=3).sum().backward()
    for op in ("bias_gelu_fwd", "bias_gelu_bwd", "add_layer_norm_fwd", "add_layer_norm_bwd"):
        assert f"fastbert.{op}.default" in seen, (op, seen)
