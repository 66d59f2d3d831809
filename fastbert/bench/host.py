"""The host cost of fastbert's CUDA code path, counted on any CPU: what benchmarks/bench_host.py
prints and tests/bench/test_host.py holds to.

The Triton backend runs on CPU tensors under TRITON_INTERPRET=1 (set before triton is imported);
here every Triton launch is replaced by a counter, so nothing runs but the host path the GPU would
wait on: the launchers' Python, the torch calls around the kernels, the autograd machinery. For
one call of an op, a layer or a model it counts

- Triton launches;
- aten calls (what torch's dispatcher sees below autograd), all of them, and those that launch a
  kernel or allocate on a GPU: every call but views and the host syncs;
- host syncs: calls whose result the host must read (`.item()`, `.tolist()`, `nonzero`, shapes
  that depend on values), each a stall of the GPU's queue and a wall against CUDA graphs;

and times the host microseconds of one call (launches skipped), with its floor: the same aten
calls that launch or allocate replayed back to back, so that the difference is the host time
beyond the launches (fastbert's Python, autograd's, views, syncs). The counts are exact and the
same on every machine; the times are this CPU's.

A layer's share is half the difference between a model of three layers and one of one, so that
the embeddings, the unpadding and the pooling count once, in the model's own line (and a time's
noise, which the difference of two models' times carries whole, is halved).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Counts(NamedTuple):
    """What one call costs the host: Triton launches, aten calls, the aten calls that launch or
    allocate, host syncs."""

    launches: int
    aten: int
    work: int
    syncs: int

    def __sub__(self, other: "Counts") -> "Counts":
        return Counts(*(a - b for a, b in zip(self, other)))

    def per(self, n: int) -> "Counts":
        """These counts shared by n equal parts (n layers of one kind): each must divide."""
        if any(c % n for c in self):
            raise ValueError(f"fastbert: counts {tuple(self)} do not divide among {n} layers: they are not alike")
        return Counts(*(c // n for c in self))

    @property
    def operations(self) -> int:
        """Triton launches and aten calls that launch or allocate: what the GPU's queue receives."""
        return self.launches + self.work


def require_interpreter() -> None:
    """Raise a one-line error unless the Triton interpreter is on (the counts need it)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("fastbert: the host counts run the Triton backend on the CPU: set TRITON_INTERPRET=1 "
                           "before triton is imported (benchmarks/bench_host.py does)")


class _Tally:
    def __init__(self) -> None:
        self.launches = self.aten = self.work = self.syncs = 0


@contextlib.contextmanager
def launches_counted(tally: Optional[_Tally] = None) -> Iterator[_Tally]:
    """Inside the block every Triton launch is counted and skipped (the outputs keep whatever
    their allocation held)."""
    require_interpreter()
    from triton.runtime.interpreter import InterpretedFunction

    tally = tally or _Tally()
    real = InterpretedFunction.run

    def counted(self, *args, grid, warmup, **kwargs):
        if not warmup:
            tally.launches += 1

    InterpretedFunction.run = counted
    try:
        yield tally
    finally:
        InterpretedFunction.run = real


def _is_sync(func) -> bool:
    return torch.Tag.data_dependent_output in func.tags or torch.Tag.dynamic_output_shape in func.tags


class _AtenCounter(TorchDispatchMode):
    def __init__(self, tally: _Tally) -> None:
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.tally.aten += 1
        if _is_sync(func):
            self.tally.syncs += 1
        elif not func.is_view:
            self.tally.work += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _tolist_counted(tally: _Tally) -> Iterator[None]:
    # .tolist() of a CPU tensor reads it without a dispatcher call; of a CUDA one it syncs
    real = torch.Tensor.tolist

    def counted(self):
        tally.syncs += 1
        return real(self)

    torch.Tensor.tolist = counted
    try:
        yield
    finally:
        torch.Tensor.tolist = real


def count(fn: Callable[[], object]) -> Counts:
    """The counts of one call of fn."""
    tally = _Tally()
    with launches_counted(tally), _tolist_counted(tally), _AtenCounter(tally):
        fn()
    return Counts(tally.launches, tally.aten, tally.work, tally.syncs)


@contextlib.contextmanager
def denormals_flushed() -> Iterator[None]:
    # a skipped launch leaves its output as the allocator found it: bytes that read as denormal floats
    # slow the CPU's arithmetic in the torch calls after it by factors, at random; on a GPU that
    # arithmetic is off the host, so here it is flushed to zero
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)  # torch's default (it has no getter to restore another)


def host_us(fn: Callable[[], object], calls: int = 20, rounds: int = 5) -> float:
    """Microseconds of host time per call of fn, launches skipped: the fastest of `rounds` rounds of
    `calls` calls (after one untimed call)."""
    with launches_counted(), denormals_flushed():
        fn()
        return _fastest(fn, calls, rounds)


def _fastest(fn: Callable[[], object], calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not func.is_view and not _is_sync(func):
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def floor_us(fn: Callable[[], object], calls: int = 20, rounds: int = 5) -> float:
    """Microseconds per call of the floor under fn's host time: the aten calls of one call of fn
    that launch or allocate, recorded and replayed back to back with no Python of fastbert's or
    autograd's in between (each as torch's dispatcher takes it from Python, on the recorded
    inputs). A Triton launch costs nothing here (it is skipped in both), so host_us - floor_us is
    the host time of everything but the launches: fastbert's Python, autograd's, views, syncs."""
    replay = floor_replay(fn)
    with denormals_flushed():
        replay()
        return _fastest(replay, calls, rounds)


def floor_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """floor_us's replay of fn's aten calls that launch or allocate (fn called twice to record them)."""
    with launches_counted():
        fn()
        return aten_replay(fn)


def aten_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """A replay of the aten calls that launch or allocate of one call of fn (made here, launches and
    all: under launches_counted, or against a stand-in driver), back to back with nothing around them."""
    recorder = _Recorder()
    with recorder:
        fn()
    recorded = recorder.calls

    def replay():
        for func, args, kwargs in recorded:
            func(*args, **kwargs)

    return replay


def timed_together(fns: List[Callable[[], object]], calls: int, rounds: int) -> List[float]:
    """host_us of each of fns (launches skipped), their rounds taken in turn: round r times every fn
    before round r + 1 times any, so that a stretch of a busy machine slows one round of each, and
    the fastest round of each (what is kept) comes from the quiet stretches of the whole run."""
    best = [float("inf")] * len(fns)
    with launches_counted(), denormals_flushed():
        for fn in fns:
            fn()
        for _ in range(rounds):
            for i, fn in enumerate(fns):
                best[i] = min(best[i], _fastest(fn, calls, 1))
    return best


# --------------------------------------------------------------------------------------------
# What is measured: the fused ops at BERT-base's sizes, and whole layers


class Sizes(NamedTuple):
    batch: int
    seq: int
    hidden: int
    heads: int
    ffn: int


# The counts are taken at BERT-base's sizes on a padded batch of 8 x 64. The times at sizes so small
# that the torch calls' arithmetic on the CPU (which on a GPU would be a kernel, off the host) costs
# next to nothing, so that what is timed is the host's part: the same calls, the same code path.
COUNTED = Sizes(batch=8, seq=64, hidden=768, heads=12, ffn=3072)
TIMED = Sizes(batch=2, seq=8, hidden=64, heads=4, ffn=128)


class Case(NamedTuple):
    """One measured call: its name, what it is (op or model), whether it trains (forward + backward)
    and `make`, which builds its inputs at the given sizes and returns the call."""

    name: str
    kind: str
    training: bool
    make: Callable[[Sizes], Callable[[], object]]


def _mask(z: Sizes) -> torch.Tensor:
    # real lengths from seq / 2 to seq, padded on the right
    lengths = torch.linspace(z.seq // 2, z.seq, z.batch).round().long()
    return (torch.arange(z.seq)[None, :] < lengths[:, None]).long()


def _leaf(*shape, grad: bool) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


def _backward(out) -> None:
    first = out[0] if isinstance(out, tuple) else out
    first.float().sum().backward()


def _op_cases() -> List[Case]:
    from fastbert import ops

    def attention(training: bool):
        def make(z: Sizes):
            q, k, v = (_leaf(z.batch, z.heads, z.seq, z.hidden // z.heads, grad=training) for _ in range(3))
            mask = _mask(z)
            p = 0.1 if training else 0.0
            return lambda: _run(lambda: ops.attention(q, k, v, mask, dropout_p=p, backend="triton"), training,
                                (q, k, v))
        return make

    def add_layer_norm(training: bool):
        def make(z: Sizes):
            x, r = (_leaf(z.batch * z.seq, z.hidden, grad=training) for _ in range(2))
            w, b = (_leaf(z.hidden, grad=training) for _ in range(2))
            p = 0.1 if training else 0.0
            return lambda: _run(lambda: ops.add_layer_norm(x, r, w, b, 1e-12, dropout_p=p, backend="triton"), training,
                                (x, r, w, b))
        return make

    def bias_gelu(training: bool):
        def make(z: Sizes):
            x, b = _leaf(z.batch * z.seq, z.ffn, grad=training), _leaf(z.ffn, grad=training)
            return lambda: _run(lambda: ops.bias_gelu(x, b, backend="triton"), training, (x, b))
        return make

    def geglu(training: bool):
        def make(z: Sizes):
            x = _leaf(z.batch * z.seq, 2 * z.ffn, grad=training)
            return lambda: _run(lambda: ops.geglu(x, backend="triton"), training, (x,))
        return make

    cases = []
    for name, build in (("attention", attention), ("add_layer_norm", add_layer_norm), ("bias_gelu", bias_gelu),
                        ("geglu", geglu)):
        for training in (False, True):
            cases.append(Case(name, "op", training, build(training)))
    return cases


def _run(fn: Callable[[], object], training: bool, leaves=()) -> None:
    # a training step starts with no gradients (optimizer.zero_grad() sets them to None), so that the
    # backward writes them rather than adding into last step's
    if training:
        for t in leaves:
            t.grad = None
        _backward(fn())
    else:
        with torch.no_grad():
            fn()


def _model(family: str, layers: int, z: Sizes):
    from fastbert.model.bert import BertModel
    from fastbert.model.config import BertConfig, ModernBertConfig
    from fastbert.model.modernbert import ModernBertModel

    torch.manual_seed(0)
    if family == "bert":
        config = BertConfig(vocab_size=1000, hidden_size=z.hidden, num_hidden_layers=layers,
                            num_attention_heads=z.heads, intermediate_size=z.ffn, max_position_embeddings=512)
        model = BertModel(config, add_pooling_layer=False)
    else:
        # ModernBERT-base's shape (FFN 1152 at hidden 768); its second layer is a local (sliding-window) one
        config = ModernBertConfig(vocab_size=1000, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                  sep_token_id=2, hidden_size=z.hidden, num_hidden_layers=layers,
                                  num_attention_heads=z.heads, intermediate_size=z.hidden * 3 // 2,
                                  max_position_embeddings=512)
        model = ModernBertModel(config)
    return model.set_backend("triton")


def _model_case(family: str, layers: int, training: bool) -> Callable[[Sizes], Callable[[], object]]:
    def make(z: Sizes):
        model = _model(family, layers, z).train(training)
        ids = torch.randint(5, 1000, (z.batch, z.seq))
        mask = _mask(z)
        params = list(model.parameters())
        return lambda: _run(lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state, training, params)
    return make


FAMILIES = ("bert", "modernbert")
LAYERS = 3  # the larger model: a layer's row is (it - the one-layer model) / (LAYERS - 1)


def cases(families=FAMILIES) -> List[Case]:
    """Every measured call: the ops, then per family a model of one layer and of LAYERS."""
    out = _op_cases()
    for family in families:
        for training in (False, True):
            for layers in (1, LAYERS):
                out.append(Case(f"{family} x{layers}", "model", training, _model_case(family, layers, training)))
    return out


class Row(NamedTuple):
    name: str
    training: bool
    counts: Counts
    us: Optional[float]
    floor: Optional[float] = None

    @property
    def own(self) -> Optional[float]:
        """Host microseconds beyond the launches: us less the floor of its aten calls."""
        return None if self.us is None else self.us - self.floor


def measure(selected: List[Case], time_calls: bool = True, calls: int = 20, rounds: int = 5) -> List[Row]:
    """Counts (at COUNTED sizes) and, with time_calls, host microseconds (at TIMED sizes) of every
    case; for each family, a row '<family> layer' = its LAYERS-layer model less its one-layer one,
    shared by the LAYERS - 1 layers between them.
    The times of every case and of every floor are taken in turn (timed_together)."""
    counts = [count(_warm(case.make(COUNTED))) for case in selected]
    us = floor = [None] * len(selected)
    if time_calls:
        fns = [_warm(case.make(TIMED)) for case in selected]
        times = timed_together(fns + [floor_replay(fn) for fn in fns], calls, rounds)
        us, floor = times[:len(fns)], times[len(fns):]
    rows = [Row(case.name, case.training, c, u, f) for case, c, u, f in zip(selected, counts, us, floor)]
    by_name = {(r.name, r.training): r for r in rows}
    for family in FAMILIES:
        for training in (False, True):
            one, more = by_name.get((f"{family} x1", training)), by_name.get((f"{family} x{LAYERS}", training))
            if one and more:
                n = LAYERS - 1
                us = floor = None
                if one.us is not None:
                    us, floor = (more.us - one.us) / n, (more.floor - one.floor) / n
                rows.append(Row(f"{family} layer", training, (more.counts - one.counts).per(n), us, floor))
    return rows


def _warm(fn: Callable[[], object]) -> Callable[[], object]:
    # a first call fills what is filled once (caches, tables made on first use)
    with launches_counted():
        fn()
    return fn


def format_rows(rows: List[Row]) -> str:
    head = (f"{'call':<18}{'mode':<10}{'launches':>9}{'aten':>6}{'launch/alloc':>13}{'syncs':>6}{'ops':>5}"
            f"{'host us':>9}{'floor us':>9}{'own us':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        c = r.counts
        us = "" if r.us is None else f"{r.us:9.0f}{r.floor:9.0f}{r.own:8.0f}"
        lines.append(f"{r.name:<18}{'training' if r.training else 'inference':<10}{c.launches:>9}{c.aten:>6}"
                     f"{c.work:>13}{c.syncs:>6}{c.operations:>5}{us}")
    return "\n".join(lines)


def as_dicts(rows: List[Row]) -> List[Dict[str, object]]:
    return [{"call": r.name, "training": r.training, **r.counts._asdict(), "operations": r.counts.operations,
             "host_us": r.us, "floor_us": r.floor, "own_us": r.own} for r in rows]
