"""What a model keeps of its layers' reads (a ModernBERT model's: kept_reads, on the same terms). What a
stack of BERT-family layers hands fastbert.ops.encoder's one-call routes (encoder_stack,
int8_encoder_stack): each layer's tensors (BertLayer.weights(), then the parts of its joined QKV
tensors), heads, epsilons, GELU form and backend, read from its modules once and kept in a Plan on
the model. Reading them afresh on every call costs far more than checking the kept plan
(benchmarks/RESULTS.md has both), and the plan can never be stale:
- every attribute read to build it is recorded where nn.Module keeps it (the instance __dict__,
  _parameters, _buffers, _modules), along the family's role properties (self_attention, ffn_norm,
  ...), and each call checks that every one still holds the same object: an assignment anywhere on
  the way (a new submodule, Parameter or buffer, load_state_dict(assign=True), to() giving buffers
  new tensors, a new eps, train()) makes it rebuild;
- the QKV projections' joined tensors (their weights, biases, scales made slices of one tensor):
  the extension checks that the parts are still those slices (what fastbert.model.joined.views_of
  checks) before it runs a layer, and returns nothing where one is not (.data = ..., to()); the
  model then forgets the plan and reads a new one, which joins them again;
- writes in place (copy_, optimizers fused or not, load_state_dict) and .data on any other tensor
  need no check: the extension reads the very tensors the modules hold.
A generation counter bumped by module registration hooks would not see a plain attribute set (a new
eps, train()), which this record does.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional

import torch
from torch import nn

from fastbert.model.layers import BertLayer
from fastbert.model.quantize import Int8Linear
from fastbert.ops.bias_gelu import GELU_FORMS

_ABSENT = object()
# BertLayer.forward as defined: a layer whose forward is another (a subclass's, or one set on the class
# or the instance later) runs as it is, never from a plan
_BERT_FORWARD = BertLayer.forward


class Reader:
    """`module` seen through attribute reads that find what nn.Module would (a data descriptor such
    as a property, then the instance __dict__, then the class, then _parameters, _buffers, _modules),
    each recorded in `reads` ({key: (namespace, name, value or _ABSENT)}, one entry a namespace and
    name): the classes' namespaces along the MRO up to the one that has the name, then the one
    namespace of the instance that holds it (nn.Module keeps a name in one of them; moving it is a
    deletion from the other, which the record sees). A property or method runs on the reader, so what
    it reads is recorded too; a submodule read comes back as a reader (module_of(r) is the module)."""

    __slots__ = ("_module", "_reads")

    def __init__(self, module: nn.Module, reads: dict):
        self._module, self._reads = module, reads

    def _note(self, owner, space, name: str, value) -> None:
        self._reads[(id(owner), name)] = (space, name, value)

    def __getattr__(self, name: str):
        module = self._module
        attr = _ABSENT
        for cls in type(module).__mro__:
            attr = vars(cls).get(name, _ABSENT)
            self._note(cls, vars(cls), name, attr)
            if attr is not _ABSENT:
                break
        if attr is not _ABSENT and (hasattr(attr, "__set__") or hasattr(attr, "__delete__")):
            return attr.__get__(self, type(module))
        value = module.__dict__.get(name, _ABSENT)
        if value is _ABSENT and attr is not _ABSENT:  # a class attribute the instance does not shadow
            self._note(module.__dict__, module.__dict__, name, _ABSENT)
            return attr.__get__(self, type(module)) if hasattr(attr, "__get__") else attr
        for space in (module.__dict__, module._parameters, module._buffers, module._modules):
            value = space.get(name, _ABSENT)
            if value is not _ABSENT:
                self._note(space, space, name, value)
                break
        else:
            raise AttributeError(f"{type(module).__name__!r} object has no attribute {name!r}")
        return Reader(value, self._reads) if isinstance(value, nn.Module) else value


def module_of(r) -> nn.Module:
    return r._module if isinstance(r, Reader) else r


class Plan(NamedTuple):
    layers: tuple                   # the layer modules, in order
    reads: list                     # (namespace, name, value): every attribute the plan was read from
    runs: bool                      # whether the extension runs every layer (else the fields below are empty)
    tensors: List[list] = []        # per layer: its weights() then its joined QKV tensors' parts
    products: List[tuple] = []      # per layer: the weights of its 4 products (QKV, attention output, FFN in and out)
    heads: List[int] = []
    eps: List[float] = []           # two a layer
    forms: List[str] = []           # each layer's GELU form
    backends: frozenset = frozenset()  # the layers' backend settings
    made: Optional[dict] = None     # what a model makes of the plan once (BertModel.kept_layers), kept with it

    def __deepcopy__(self, memo) -> None:
        # a copied model reads its own layers afresh (this plan's reads hold class namespaces,
        # which no copy can take)
        return None

    def __reduce__(self):
        return type(None), ()  # pickled as None: an unpickled model reads its layers afresh (as a copy)


def _entry(layer: nn.Module, reads: dict, int8: bool):
    """(tensors, products, heads, eps1, eps2, form, backend) of one layer, or None where the
    extension's whole layer does not run it: what BertLayer._one_call asks of a float layer that
    does not change from call to call (eval mode, nn.Linear layers, a GELU feed-forward, BERT's
    absolute positions); int8: Int8Linear layers, a GELU feed-forward, absolute positions."""
    r = Reader(layer, reads)
    act, linear = r.ffn_act, Int8Linear if int8 else nn.Linear
    sa = r.self_attention
    if (act not in GELU_FORMS or r.training or getattr(r.forward, "__func__", None) is not _BERT_FORWARD
            or r.ffn_gated or r.rotary_base is not None
            or any(type(module_of(m)) is not linear for m in (sa.query, sa.key, sa.value, r.attention_output,
                                                             r.ffn_input, r.ffn_output))):
        return None
    qkv = module_of(sa).joined_qkv()  # its parts are checked by the extension, not recorded here
    names = ("weight", "weight_scale", "bias") if int8 else ("weight", "bias")
    parts = [getattr(m, name) for name in names for m in (sa.query, sa.key, sa.value)]
    weights = r.weights_with(qkv)
    if any(t is None for t in (*weights, *parts)):
        return None
    products = (weights.qkv_weight, weights.out_weight, weights.ffn_in_weight, weights.ffn_out_weight)
    return ([*weights, *parts], products, int(sa.num_attention_heads), float(r.attention_norm.eps),
            float(r.ffn_norm.eps), GELU_FORMS[act], r.backend)


def _build(layers: tuple, int8: bool) -> Plan:
    reads: dict = {}
    entries = []
    with torch.no_grad():
        for layer in layers:
            entry = _entry(layer, reads, int8)
            if entry is None:
                return Plan(layers, list(reads.values()), False)
            entries.append(entry)
    if not entries:
        return Plan(layers, list(reads.values()), False)
    tensors, products, heads, eps1, eps2, forms, backends = zip(*entries)
    eps = [e for pair in zip(eps1, eps2) for e in pair]
    return Plan(layers, list(reads.values()), True, list(tensors), list(products), list(heads), eps, list(forms),
                frozenset(backends), {})


def _current(plan: Optional[Plan], layers: tuple) -> bool:
    if plan is None or plan.layers != layers:
        return False
    for space, name, value in plan.reads:
        if space.get(name, _ABSENT) is not value:
            return False
    return True


_PLAN_KEYS = ("_stack_plan", "_stack_plan_int8")
_KEPT_KEY = "_kept_reads"


def drop_plans(model: nn.Module, int8: Optional[bool] = None) -> None:
    """Forget the model's plans (they hold its layers' tensors; int8: only that one; None: every
    plan and kept_reads'): to() and the like give it new ones, and a joined tensor whose parts moved
    is joined again as a plan is read."""
    for key in (*_PLAN_KEYS, _KEPT_KEY) if int8 is None else (_PLAN_KEYS[int8],):
        model.__dict__.pop(key, None)


class KeptReads(NamedTuple):
    layers: tuple   # the layer modules, in order
    reads: list     # (namespace, name, value): every attribute the entries were read from
    entries: Optional[list]  # per layer what `entry` read of it; None where it read None of one

    def __deepcopy__(self, memo) -> None:
        return None  # as Plan's: a copied model reads its own layers afresh

    def __reduce__(self):
        return type(None), ()  # as Plan's


def kept_reads(model: nn.Module, layers: tuple, entry) -> KeptReads:
    """What entry(reader) reads of each layer (a Reader: every attribute it reads is recorded),
    kept on the model and read again only when something it was read from changed (as plan()'s
    plan); .entries None where entry gave None for a layer (the layers then run as they are). For a
    family whose layers the extension's stack does not run (ModernBERT's), so that an inference
    forward does not read every module of every layer again."""
    kept = model.__dict__.get(_KEPT_KEY)
    if not _current(kept, layers):
        reads: dict = {}
        entries: Optional[list] = []
        with torch.no_grad():
            for layer in layers:
                got = entry(Reader(layer, reads))
                if got is None:
                    entries = None
                    break
                entries.append(got)
        kept = model.__dict__[_KEPT_KEY] = KeptReads(layers, list(reads.values()), entries)
    return kept


def plan(model: nn.Module, layers: tuple, int8: bool) -> Plan:
    """The plan for the model's layers (all of them, in order): the one kept on the model, or a new
    one where there is none or the kept one was read from something that changed since."""
    key = _PLAN_KEYS[int8]
    kept = model.__dict__.get(key)
    if not _current(kept, layers):
        kept = model.__dict__[key] = _build(layers, int8)
    return kept


def hooked(layers) -> bool:
    """Whether calling a layer would run a forward hook (its own or a global one)."""
    from torch.nn.modules import module as torch_module

    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
                or any(layer._forward_hooks or layer._forward_pre_hooks for layer in layers))
