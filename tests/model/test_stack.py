"""The encoder's layers in one call of the extension (fastbert.ops.encoder's encoder_stack and
int8_encoder_stack, their tensors kept by fastbert.model.stack_plan): bit for bit the layers run one at
a time, and a plan that never goes stale, whatever changes the modules it was read from."""
import gc
import weakref

import pytest
import torch
from torch import nn

import fastbert
from fastbert.model import stack_plan
from fastbert.model.layers import BertLayer
from fastbert.ops import encoder, gemm
from tests.helpers.backends import require

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
FAMILIES = {"bert": (transformers.BertConfig, fastbert.BertConfig, fastbert.BertModel, SMALL),
            "distilbert": (transformers.DistilBertConfig, fastbert.DistilBertConfig, fastbert.DistilBertModel,
                           dict(vocab_size=120, dim=64, n_layers=2, n_heads=4, hidden_dim=96)),
            "mpnet": (transformers.MPNetConfig, fastbert.MPNetConfig, fastbert.MPNetModel, SMALL)}
IDS = torch.randint(5, 120, (3, 12), generator=torch.Generator().manual_seed(3))
MASKS = {"padded": torch.ones(3, 12, dtype=torch.long),
         "packed": torch.tensor([[1] * 12, [1] * 7 + [0] * 5, [1] * 2 + [0] * 10])}


def _model(family="bert", seed=0):
    hf_config, config, cls, small = FAMILIES[family]
    torch.manual_seed(seed)
    return cls(config(**hf_config(**small).to_dict())).eval()


class Spy:
    """Counts the forwards whose layers ran in one call; `off` runs them one by one instead. A call
    that found a joined tensor's parts moved (and is made again, the parts joined anew) is "again"."""

    def __init__(self, monkeypatch):
        self.ran, self.off = [], False
        for name in ("encoder_stack", "int8_encoder_stack"):
            real = getattr(encoder, name)

            def spy(*args, _real=real, **kwargs):
                out = None if self.off else _real(*args, **kwargs)
                self.ran.append("again" if out == [] else out is not None)
                return out

            monkeypatch.setattr(encoder, name, spy)

    def both(self, model, mask="packed", **kwargs):
        """(the forward with every layer in one call, the forward with the layers one by one)."""
        with torch.no_grad():
            self.ran.clear()
            fast = model(IDS, MASKS[mask], **kwargs)
            assert [r for r in self.ran if r != "again"] == [True], "the layers did not run in one call"
            self.off = True
            try:
                slow = model(IDS, MASKS[mask], **kwargs)
            finally:
                self.off = False
        return fast, slow

    def check(self, model, mask="packed"):
        """The one-call forward's output, after checking it equals the layers' one by one."""
        fast, slow = self.both(model, mask)
        assert torch.equal(fast.last_hidden_state, slow.last_hidden_state), (
            (fast.last_hidden_state - slow.last_hidden_state).abs().max().item())
        return fast.last_hidden_state


@pytest.fixture
def spy(monkeypatch):
    """The products on a GEMM path the extension's layers run at every instruction-set level (fp32:
    addmm, whatever this CPU measured fastest; int8: weights stored packed), the stack spied on."""
    require("cpp")
    assert fastbert.backend.cpp_function("encoder_forward") is not None, "the built extension predates encoder_forward"
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", "packed")
    with gemm.forced("addmm"):
        yield Spy(monkeypatch)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("quantize, mask, path", [(None, "padded", "addmm"), (None, "packed", "addmm"),
                                                  (None, "packed", "dot"), (None, "packed", "onednn"),
                                                  (None, "padded", "mkl_packed"), (None, "packed", "onednn_packed"),
                                                  ("int8", "packed", None)])
def test_every_layer_in_one_call_gives_the_same_bits(spy, family, mask, quantize, path):
    """fp32 on padded and packed rows, on every GEMM path the extension runs; int8 (packed rows
    whatever the mask) on packed weights."""
    if path is not None and path not in gemm.candidates("fwd", torch.float32):
        pytest.skip(f"the fp32 GEMM path {path} is not used here: {gemm.unavailable().get((path, 'fwd', torch.float32))}")
    model = _model(family)
    if quantize:
        model.quantize_(quantize)
    with torch.no_grad(), gemm.forced(path):
        model(IDS, MASKS[mask])  # the first call measures the GEMM paths
        fast, slow = spy.both(model, mask, output_hidden_states=True)
    assert len(fast.hidden_states) == len(slow.hidden_states) == 3
    for a, b in zip((fast.last_hidden_state, *fast.hidden_states), (slow.last_hidden_state, *slow.hidden_states)):
        assert torch.equal(a, b), (a - b).abs().max().item()


def _layer(model) -> BertLayer:
    return model.encoder.layer[1]


def _fresh(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.05


def _data_query(model):
    q = _layer(model).attention.self.query
    q.weight.data = _fresh(q.weight.shape, 1)  # new memory: the joined QKV weight is not its slice any more


def _in_place(model):
    _layer(model).output.dense.weight.mul_(-1.5)


def _data_output(model):
    w = _layer(model).attention.output.dense.weight
    w.data = _fresh(w.shape, 2)


def _copy_query(model):
    _layer(model).attention.self.value.weight.copy_(_fresh((64, 64), 3))


def _load_state(model):
    model.load_state_dict(_model(seed=7).state_dict())


def _load_assign(model):
    model.load_state_dict(_model(seed=8).state_dict(), assign=True)


def _new_module(model):
    torch.manual_seed(9)
    _layer(model).intermediate.dense = nn.Linear(64, 96)


def _new_parameter(model):
    _layer(model).attention.output.LayerNorm.weight = nn.Parameter(torch.full((64,), 0.5))


def _eps(model):
    _layer(model).output.LayerNorm.eps = 0.5


def _activation(model):
    _layer(model).intermediate.hidden_act = "gelu_new"


def _to_and_back(model):
    model.to(torch.float64)
    with torch.no_grad():
        _layer(model).attention.self.key.weight.mul_(2)
    model.to(torch.float32)


def _swap(model):
    q = _layer(model).attention.self.query
    torch.utils.swap_tensors(q.weight, nn.Parameter(_fresh(q.weight.shape, 4)))


def _sgd(model):
    _optimizer_step(model, torch.optim.SGD(model.parameters(), lr=0.5, foreach=False))


def _adamw_fused(model):
    _optimizer_step(model, torch.optim.AdamW(model.parameters(), lr=0.1, fused=True))


def _optimizer_step(model, opt):
    with torch.enable_grad():
        model.train()
        model(IDS, MASKS["packed"]).last_hidden_state.square().mean().backward()
        opt.step()
        model.eval()


def _class_property(model, monkeypatch):
    monkeypatch.setattr(BertLayer, "ffn_act", property(lambda self: "gelu_new"))


CHANGES = [_data_query, _in_place, _data_output, _copy_query, _load_state, _load_assign, _new_module, _new_parameter,
           _eps, _activation, _to_and_back, _swap, _sgd, _adamw_fused, _class_property]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_the_plan_never_goes_stale(spy, change, monkeypatch):
    """Each way of changing what the layers hand the extension: the next one-call forward equals
    the layers run one by one on the changed model, and differs from the forward before."""
    model = _model()
    with torch.no_grad():
        model(IDS, MASKS["packed"])
    before = spy.check(model)
    with torch.no_grad():
        change(model, monkeypatch) if change is _class_property else change(model)
    after = spy.check(model)
    assert not torch.equal(before, after), "the change did not change the output: the test would not see a stale plan"


def test_the_plan_is_kept_while_nothing_changes(spy):
    model = _model()
    with torch.no_grad():
        model(IDS, MASKS["packed"])
        model(IDS, MASKS["packed"])
        kept = model.__dict__["_stack_plan"]
        model(IDS, MASKS["packed"])
    assert model.__dict__["_stack_plan"] is kept


def test_int8_plan_follows_loads_and_moves(spy):
    """int8: load_state_dict quantizes into the same tensors (in place); .data on a QKV weight
    moves it out of the joined tensor; both are what the next one-call forward uses."""
    model = _model().quantize_("int8")
    with torch.no_grad():
        model(IDS, MASKS["packed"])
    before = spy.check(model)
    model.load_state_dict(_model(seed=5).state_dict())
    loaded = spy.check(model)
    assert not torch.equal(before, loaded)
    q = _layer(model).attention.self.query
    q.weight.data = q.weight.flip(0).clone()
    moved = spy.check(model)
    assert not torch.equal(loaded, moved)


def test_a_forward_hook_on_a_layer_still_runs(spy):
    model = _model()
    seen = []
    _layer(model).register_forward_hook(lambda module, args, out: seen.append(module))
    with torch.no_grad():
        model(IDS, MASKS["packed"])
        spy.ran.clear()
        model(IDS, MASKS["packed"])
    assert True not in spy.ran and len(seen) == 2  # the layers one by one


def test_the_reader_finds_what_getattr_finds():
    """stack_plan.Reader's lookup order is nn.Module's: a property, the instance, the class, then parameters,
    buffers and submodules; a missing name is an AttributeError."""
    layer = _model().encoder.layer[0]
    reads = {}
    r = stack_plan.Reader(layer, reads)
    assert stack_plan.module_of(r.ffn_norm) is layer.ffn_norm and r.ffn_act == layer.ffn_act
    assert r.backend is layer.backend and r.training is layer.training
    assert r.intermediate.dense.weight is layer.intermediate.dense.weight
    layer.backend = "torch"
    assert r.backend == "torch"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        assert r.nothing is None  # never reached: the read raises
    assert reads


def test_to_lets_the_plan_go(spy):
    """The plan holds the layers' tensors: to() drops it, so no old copy of the weights stays alive."""
    model = _model().quantize_("int8")
    with torch.no_grad():
        model(IDS, MASKS["packed"])
        model(IDS, MASKS["packed"])
    assert "_stack_plan_int8" in model.__dict__
    model.to(torch.float64)
    assert "_stack_plan_int8" not in model.__dict__


def test_loading_a_state_dict_lets_the_old_tensors_go(spy):
    """load_state_dict(assign=True) replaces the weights: the plan that held the old ones is dropped at
    once, so they are freed before any further forward (and the next forward builds a new plan)."""
    model = _model()
    with torch.no_grad():
        model(IDS, MASKS["packed"])
    assert "_stack_plan" in model.__dict__
    old = weakref.ref(_layer(model).intermediate.dense.weight)
    model.load_state_dict(_model(seed=8).state_dict(), assign=True)
    gc.collect()
    assert old() is None and "_stack_plan" not in model.__dict__
    with torch.no_grad():
        model(IDS, MASKS["packed"])
    assert "_stack_plan" in model.__dict__


def test_a_forward_replaced_on_a_layer_still_runs(spy):
    """A layer whose forward was replaced on the instance (as wrapping libraries do) is run through it."""
    model = _model()
    layer, seen = _layer(model), []
    real = layer.forward

    def wrapped(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    layer.forward = wrapped
    with torch.no_grad():
        model(IDS, MASKS["packed"])
        spy.ran.clear()
        model(IDS, MASKS["packed"])
    assert True not in spy.ran and len(seen) == 2  # the layers one by one


def test_a_model_that_ran_can_be_copied():
    """copy.deepcopy after a forward: the copy reads its own layers afresh (a plan holds class
    namespaces, which cannot be copied) and gives the same bits."""
    import copy

    model = _model()
    with torch.no_grad():
        want = model(IDS, MASKS["packed"]).last_hidden_state
        twin = copy.deepcopy(model)
        assert torch.equal(twin(IDS, MASKS["packed"]).last_hidden_state, want)


QUICK = (_new_parameter, _data_query, _class_property)  # the quick loop's share; the full suite runs every change


@pytest.mark.triton
@pytest.mark.parametrize("change", [c if c in QUICK else pytest.param(c, marks=pytest.mark.slow) for c in CHANGES],
                         ids=[c.__name__.strip("_") for c in CHANGES])
def test_the_kept_layers_never_go_stale(change, monkeypatch):
    """On Triton the layers run one by one on what the model keeps of them (BertModel.kept_layers,
    from the same plan): after each change the next forward equals one that reads every layer
    afresh, and differs from the forward before."""
    require("triton")
    model = _model().set_backend("triton")

    def forward():
        with torch.no_grad():
            return model(IDS, MASKS["packed"]).last_hidden_state

    def afresh():
        with monkeypatch.context() as patch:
            patch.setattr(type(model), "kept_layers", lambda self, count: None)
            return forward()

    forward()
    with torch.no_grad():
        assert model.kept_layers(2) is not None, "the layers are not kept: the test would prove nothing"
    before = forward()
    assert torch.equal(before, afresh())
    with torch.no_grad():
        change(model, monkeypatch) if change is _class_property else change(model)
    after = forward()
    assert torch.equal(after, afresh()), (after - afresh()).abs().max().item()
    assert not torch.equal(before, after), "the change did not change the output: the test would not see a stale read"


def test_a_forward_set_on_the_layer_class_runs_instead_of_the_plan(spy, monkeypatch):
    """The plan stands for BertLayer.forward as defined: one set on the class after a plan was made
    (a patch, a wrapper) is what runs."""
    model = _model()
    before = spy.check(model)
    real = BertLayer.forward
    monkeypatch.setattr(BertLayer, "forward", lambda self, *args, **kwargs: (real(self, *args, **kwargs)[0] * 2, None))
    with torch.no_grad():
        spy.ran.clear()
        after = model(IDS, MASKS["packed"]).last_hidden_state
    assert True not in spy.ran, "the layers ran in one call, not through their forward"
    assert not torch.equal(after, before)
