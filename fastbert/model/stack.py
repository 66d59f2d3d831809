"""A model's whole stack of encoder layers in one call of the extension, for inference on the C++
kernels: csrc/encoder_layer.cpp's encoder_forward (float32, each layer ops.encoder_layer's fused
path) and int8_encoder_forward (each layer fastbert.model.int8's), bit for bit the layers called
one at a time, with no Python between them. For one short sequence the Python that gathered each
layer's tensors and called it was about a tenth of an int8 forward (60 us a layer).

What each layer hands the extension (its tensors, heads, epsilons, GELU form, backend) is read from
its modules once and kept in a Plan on the model. The plan can never be stale:
- every attribute read to build it is recorded where nn.Module keeps it (the instance __dict__,
  _parameters, _buffers, _modules), along the family's role properties (self_attention, ffn_norm,
  ...), and each call checks that every one still holds the same object: an assignment anywhere on
  the way (a new submodule, Parameter or buffer, load_state_dict(assign=True), to() giving buffers
  new tensors, a new eps, train()) makes it rebuild;
- the QKV projections' joined tensors (their weights, biases, scales made slices of one tensor):
  the extension checks that the parts are still those slices (what layers.views_of checks) before
  it runs a layer, and returns nothing where one is not (.data = ..., to()); the plan is then rebuilt,
  which joins them again;
- writes in place (copy_, optimizers fused or not, load_state_dict) and .data on any other tensor
  need no check: the extension reads the very tensors the modules hold.
The GEMM paths are looked up on every call (ops.gemm.layer_paths, once per distinct layer shape).
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import nn

from fastbert import backend as _backend
from fastbert.ops import gemm
from fastbert.ops.bias_gelu import GELU_FORMS

_ABSENT = object()


class _Reader:
    """`module` seen through attribute reads that find what nn.Module would (a data descriptor such
    as a property, then the instance __dict__, then the class, then _parameters, _buffers, _modules),
    each recorded in `reads` ({key: (namespace, name, value or _ABSENT)}, one entry a namespace and
    name): the classes' namespaces along the MRO up to the one that has the name, then the one
    namespace of the instance that holds it (nn.Module keeps a name in one of them; moving it is a
    deletion from the other, which the record sees). A property or method runs on the reader, so what
    it reads is recorded too; a submodule read comes back as a reader (_module(r) is the module)."""

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
        return _Reader(value, self._reads) if isinstance(value, nn.Module) else value


def _module(r) -> nn.Module:
    return r._module if isinstance(r, _Reader) else r


class Plan(NamedTuple):
    layers: tuple                   # the layer modules, in order
    reads: list                     # (namespace, name, value): every attribute the plan was read from
    runs: bool                      # whether the extension runs every layer (else the fields below are empty)
    tensors: List[list] = []        # per layer: its tensors as the extension takes them, then its joined ones' parts
    products: List[tuple] = []      # per layer: the weights of its 4 products (QKV, attention output, FFN in and out)
    heads: List[int] = []
    eps: List[float] = []           # two a layer
    forms: List[str] = []           # each layer's GELU form
    backends: frozenset = frozenset()  # the layers' backend settings


def _joined_parts(sa: _Reader, int8: bool):
    """(the QKV projections' joined tensors, their parts), joined afresh where the parts are not
    their slices any more: float (weight, bias), int8 (weight, scale, bias)."""
    from fastbert.model.int8 import qkv_int8

    mods = (sa.query, sa.key, sa.value)
    if int8:
        joined, names = qkv_int8(_module(sa)), ("weight", "weight_scale", "bias")
    else:
        joined, names = _module(sa).qkv_weight(), ("weight", "bias")
    return list(joined), [getattr(m, name) for name in names for m in mods]


def layer_tensors(layer, joined, int8: bool) -> list:
    """A layer's tensors in the order the extension's one-layer call takes them, after its joined
    QKV tensors `joined`: float (weight, bias) then fastbert.ops.LayerWeights' order; int8 (weight,
    scale, bias) then each linear layer's int8 weight, scale and bias and each norm's weight and bias."""
    out, n1, ffn_in, ffn_out, n2 = (layer.attention_output, layer.attention_norm, layer.ffn_input, layer.ffn_output,
                                    layer.ffn_norm)
    if int8:
        return [*joined, out.weight, out.weight_scale, out.bias, n1.weight, n1.bias, ffn_in.weight,
                ffn_in.weight_scale, ffn_in.bias, ffn_out.weight, ffn_out.weight_scale, ffn_out.bias, n2.weight,
                n2.bias]
    return [*joined, out.weight, out.bias, n1.weight, n1.bias, ffn_in.weight, ffn_in.bias, ffn_out.weight,
            ffn_out.bias, n2.weight, n2.bias]


def _entry(layer: nn.Module, reads: dict, int8: bool):
    """(tensors, products, heads, eps1, eps2, form, backend) of one layer, or None where the
    extension's whole layer does not run it: what BertLayer._one_call asks of a float layer that
    does not change from call to call (eval mode, nn.Linear layers, a GELU feed-forward); int8:
    Int8Linear layers, a GELU feed-forward."""
    from fastbert.model.int8 import Int8Linear
    from fastbert.model.layers import BertLayer

    r = _Reader(layer, reads)
    act, linear = r.ffn_act, Int8Linear if int8 else nn.Linear
    out, n1, ffn_in, ffn_out, n2 = r.attention_output, r.attention_norm, r.ffn_input, r.ffn_output, r.ffn_norm
    sa = r.self_attention
    if (act not in GELU_FORMS or r.training or getattr(r.forward, "__func__", None) is not BertLayer.forward
            or any(type(_module(m)) is not linear for m in (sa.query, sa.key, sa.value, out, ffn_in, ffn_out))):
        return None
    joined, parts = _joined_parts(sa, int8)
    tensors = layer_tensors(r, joined, int8)
    if any(t is None for t in tensors + parts):
        return None
    products = (joined[0], out.weight, ffn_in.weight, ffn_out.weight)
    return (tensors + parts, products, int(sa.num_attention_heads), float(n1.eps), float(n2.eps), GELU_FORMS[act],
            r.backend)


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
                frozenset(backends))


def _current(plan: Optional[Plan], layers: tuple) -> bool:
    if plan is None or plan.layers != layers:
        return False
    for space, name, value in plan.reads:
        if space.get(name, _ABSENT) is not value:
            return False
    return True


_PLAN_KEYS = ("_stack_plan", "_stack_plan_int8")


def drop_plans(model: nn.Module) -> None:
    """Forget the model's plans (they hold its layers' tensors): to() and the like give it new ones."""
    for key in _PLAN_KEYS:
        model.__dict__.pop(key, None)


def plan(model: nn.Module, layers: tuple, int8: bool) -> Plan:
    """The plan for the model's layers (all of them, in order): the one kept on the model, or a new
    one where there is none or the kept one was read from something that changed since."""
    key = _PLAN_KEYS[int8]
    kept = model.__dict__.get(key)
    if not _current(kept, layers):
        kept = model.__dict__[key] = _build(layers, int8)
    return kept


def _paths(p: Plan, count: int, rows: int, dtype: torch.dtype, ids) -> Optional[List[int]]:
    """The 4 GEMM paths of each of the first `count` layers (layer_paths once per distinct set of
    weight shapes), or None while one is not measured yet or is not one the extension runs."""
    known, out = {}, []
    for weights in p.products[:count]:
        shapes = tuple(w.shape for w in weights)
        paths = known.get(shapes)
        if paths is None:
            paths = known[shapes] = gemm.layer_paths(rows, weights, dtype, ids)
            if paths is None:
                return None
        out.extend(paths)
    return out


def _run(model: nn.Module, layers: tuple, int8: bool, count: int, hidden: torch.Tensor, rows: int, ids, call):
    """call(plan, paths) on the current plan -> its outputs, or None where the plan's layers do not
    all run in the extension here. A call that returns nothing found a joined tensor's parts moved:
    the plan is rebuilt (joining them again) and called once more."""
    for _ in range(2):
        p = plan(model, layers, int8)
        if (not p.runs or count < 1 or count > len(p.layers) or hidden.numel() == 0
                or torch.compiler.is_compiling() or any(_backend.resolve(b, hidden) != "cpp" for b in p.backends)):
            return None
        paths = _paths(p, count, rows, torch.int8 if int8 else torch.float32, ids)
        if paths is None:
            return None
        out = call(p, paths)
        if out:
            return out
        model.__dict__.pop(_PLAN_KEYS[int8], None)
    return None


def int8_stack(model: nn.Module, hidden: torch.Tensor, hq, packed: Tuple[torch.Tensor, int],
               relative_bias: Optional[torch.Tensor], keep_states: bool) -> Optional[List[torch.Tensor]]:
    """Every int8 layer of the model on the packed rows hidden (hq: their quantized rows; packed =
    (cu_seqlens, max_seqlen)) in one call -> [the last layer's output] (keep_states: every layer's),
    or None where that call does not run them (the caller runs them one by one)."""
    from fastbert.model.int8 import CPP_LAYER_PATHS

    fn = _backend.cpp_function("int8_encoder_forward")
    if fn is None or hidden.device.type != "cpu":
        return None
    cu, n = packed[0].contiguous(), int(packed[1])
    layers = tuple(model.layers)

    def call(p: Plan, paths):
        return fn(hidden, *hq, p.tensors, paths, p.heads, p.eps, p.forms, cu, n, relative_bias, keep_states)

    return _run(model, layers, True, len(layers), hidden, hq[0].shape[0], CPP_LAYER_PATHS, call)


def float_stack(model: nn.Module, count: int, hidden: torch.Tensor, mask: Optional[torch.Tensor],
                packed: Optional[Tuple[torch.Tensor, int]], relative_bias: Optional[torch.Tensor],
                keep_states: bool) -> Optional[List[torch.Tensor]]:
    """The model's first `count` float32 layers in one call, as each layer's forward would run it in
    one call (BertLayer._one_call): hidden [batch, seq, h] with mask (bool [batch, seq]) or None, or
    packed rows with packed = (cu_seqlens, max_seqlen) -> [the last output] (keep_states: every
    layer's), or None where that call does not run them (a layer with forward hooks included)."""
    from fastbert.ops.encoder_layer import CPP_LAYER_PATHS

    fn = _backend.cpp_function("encoder_forward")
    if (fn is None or hidden.dtype != torch.float32 or hidden.device.type != "cpu" or not one_call_now()
            or (mask is not None and mask.dtype != torch.bool)):
        return None
    layers = tuple(model.layers)
    if _hooked(layers[:count]):
        return None
    cu, n = (None, 0) if packed is None else (packed[0], int(packed[1]))

    def call(p: Plan, paths):
        return fn(hidden, p.tensors[:count], paths, p.heads[:count], p.eps[:2 * count], p.forms[:count], mask, cu, n,
                  relative_bias, keep_states)

    return _run(model, layers, False, count, hidden, hidden.numel() // hidden.shape[-1], CPP_LAYER_PATHS, call)


def one_call_now() -> bool:
    """Whether a float layer may run as one call now: grad mode off, not while torch.compile traces,
    no autocast (whose casts the separate ops make)."""
    return (not torch.is_grad_enabled() and not torch.compiler.is_compiling() and not torch.is_autocast_enabled("cpu")
            and not torch.is_autocast_enabled("cuda"))


def _hooked(layers) -> bool:
    """Whether calling a layer would run a forward hook (its own or a global one)."""
    from torch.nn.modules import module as _m

    return bool(_m._global_forward_hooks or _m._global_forward_pre_hooks
                or any(layer._forward_hooks or layer._forward_pre_hooks for layer in layers))
