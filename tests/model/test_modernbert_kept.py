"""ModernBertModel's inference forward runs its layers from what it keeps of them
(fastbert.model.stack_plan.kept_reads, read again whenever anything it was read from changes): after
every way of changing a layer (its tensors in place or anew, through .data, load_state_dict, to(), an
optimizer; a new module, parameter, eps, window, rotary base or GELU form; train(); a hook; the
layer's class), the next forward equals one that reads every layer afresh, bit for bit; and a model
that ran copies and pickles (BERT's too: what a model keeps is left behind, read afresh)."""
import pytest
import torch
from torch import nn

import fastbert
from fastbert.model.modernbert import ModernBertEncoderLayer
from tests.helpers.backends import require
from tests.helpers.modernbert import LENGTHS, SMALL, batch, randomize

transformers = pytest.importorskip("transformers")


def _model(backend=None):
    torch.manual_seed(0)
    cfg = fastbert.ModernBertConfig(**dict(SMALL, num_hidden_layers=3, global_attn_every_n_layers=2))
    model = fastbert.ModernBertModel(cfg).eval()
    randomize(model, 0)
    return model.set_backend(backend)


def _layer(model):
    return model.layers[1]  # a sliding layer, after the first (which has no attention norm)


def _data(model):
    w = _layer(model).attn.Wqkv.weight
    w.data = w.data * 1.5


def _in_place(model):
    _layer(model).attn.Wo.weight.mul_(1.5)


def _copy(model):
    _layer(model).mlp.Wi.weight.copy_(torch.randn_like(_layer(model).mlp.Wi.weight) * 0.1)


def _load_state(model):
    state = {k: v * 1.1 for k, v in model.state_dict().items()}
    model.load_state_dict(state)


def _load_assign(model):
    state = {k: v.clone() * 0.9 for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True)


def _new_module(model):
    old = _layer(model).mlp.Wo
    new = nn.Linear(old.in_features, old.out_features, bias=old.bias is not None)
    nn.init.normal_(new.weight, std=0.1)
    _layer(model).mlp.Wo = new


def _new_parameter(model):
    norm = _layer(model).mlp_norm
    norm.weight = nn.Parameter(norm.weight.detach() * 2)


def _eps(model):
    _layer(model).mlp_norm.eps = 0.5


def _window(model):
    _layer(model).attn.window = 2


def _rotary_base(model):
    _layer(model).attn.rope_theta = 77.0


def _activation(model):
    _layer(model).mlp.act = "gelu_pytorch_tanh" if _layer(model).mlp.act != "gelu_pytorch_tanh" else "gelu"


def _to_and_back(model):
    model.double()
    model.float()


def _sgd(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()


def _train(model):
    _layer(model).train()


def _hook(model):
    _layer(model).register_forward_hook(lambda module, args, out: (out[0] * 2, *out[1:]))


def _class_forward(model, monkeypatch):
    real = ModernBertEncoderLayer.forward

    def doubled(self, *args, **kwargs):
        h, delta, p = real(self, *args, **kwargs)
        return h, delta * 2, p

    monkeypatch.setattr(ModernBertEncoderLayer, "forward", doubled)


CHANGES = [_data, _in_place, _copy, _load_state, _load_assign, _new_module, _new_parameter, _eps, _window,
           _rotary_base, _activation, _to_and_back, _sgd, _train, _hook, _class_forward]
SAME_VALUES = (_to_and_back, _train)  # new tensors or a mode, the same values (ModernBERT's dropouts are 0)
IDS, MASK = batch(len(LENGTHS), max(LENGTHS), torch.Generator().manual_seed(1), LENGTHS)


def _check(model, change, monkeypatch):
    def forward():
        with torch.no_grad():
            return model(input_ids=IDS, attention_mask=MASK).last_hidden_state

    def afresh():
        with monkeypatch.context() as patch:
            patch.setattr(type(model), "_kept_layers", lambda self, *args: None)
            return forward()

    before = forward()
    kept = model.__dict__.get("_kept_reads")
    assert kept is not None and kept.entries is not None, "the layers are not kept: the test would prove nothing"
    assert torch.equal(before, afresh())
    with torch.no_grad():
        change(model, monkeypatch) if change is _class_forward else change(model)
    after = forward()
    assert torch.equal(after, afresh()), (after - afresh()).abs().max().item()
    if change not in SAME_VALUES:
        assert not torch.equal(after, before), "the change changed nothing: the test would prove nothing"


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_the_kept_layers_never_go_stale(change, monkeypatch):
    _check(_model(), change, monkeypatch)


@pytest.mark.triton
@pytest.mark.parametrize("change", [_data, _new_module, _window], ids=["data", "new_module", "window"])
def test_the_kept_layers_never_go_stale_on_triton(change, monkeypatch):
    require("triton")
    _check(_model("triton"), change, monkeypatch)


def test_a_model_that_ran_can_be_copied_and_gives_the_same_bits():
    import copy

    model = _model()
    with torch.no_grad():
        want = model(input_ids=IDS, attention_mask=MASK).last_hidden_state
        twin = copy.deepcopy(model)
        assert torch.equal(twin(input_ids=IDS, attention_mask=MASK).last_hidden_state, want)


def test_a_model_that_ran_pickles_and_gives_the_same_bits():
    import pickle

    for model in (_model(), fastbert.BertModel(fastbert.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                                                   num_attention_heads=4, intermediate_size=96)).eval()):
        with torch.no_grad():
            want = model(input_ids=IDS, attention_mask=MASK).last_hidden_state
            twin = pickle.loads(pickle.dumps(model))
            assert torch.equal(twin(input_ids=IDS, attention_mask=MASK).last_hidden_state, want)
