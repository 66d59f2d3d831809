"""Triton kernels of fastbert, installed as `fastbert.kernels`.

One module per op, each laid out top to bottom as: jit kernels -> launch settings table ->
plain-Python launchers (the functions `fastbert.ops` calls) -> `report_configs()`, which lists
every compiled variant the launchers can pick, for the build report (`python -m
fastbert.kernels.report`, which also checks the full report kept with the sources,
build_report.json). An op too large for one module is a package or has a settings module beside
it: layer_norm_settings; the attention/ package (launchers, forward and backward kernels, their
shared jit helpers, rotary and distance functions, argument checks, settings, the report's
variants).

    bias_gelu    bias_gelu_forward, bias_gelu_backward
    geglu        geglu_forward, geglu_backward
    layer_norm   add_layer_norm_forward, add_layer_norm_backward (rms=True: RMSNorm)
    attention    attention_forward, attention_backward,
                 varlen_attention_forward, varlen_attention_backward,
                 qkv_attention_forward, qkv_attention_backward (a layer's joined QKV rows,
                 its launches bound once per specialization)

Here: what every kernel module shares (a variant for the report, launch settings, the dropout
arguments, the sink for outputs nobody reads, outputs from one allocation, a launch bound once per
specialization, the GPU's size). This file must stay importable
without triton: the submodules import it, nothing here does.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from itertools import repeat
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

# Kernel modules whose variants the build report compiles. A new kernel module is added here
# and exposes `report_configs()` yielding KernelBuild records.
KERNEL_MODULES = ("bias_gelu", "geglu", "layer_norm", "attention", "disentangled_attention")


class Settings(NamedTuple):
    """A kernel's tile shape and launch options, as its module's settings table gives them."""

    block_m: int  # rows (queries) per tile
    block_n: int  # columns (keys) per tile
    num_warps: int
    num_stages: int = 1
    maxnreg: Optional[int] = None  # register budget given to ptxas (None: its own choice)

    def options(self) -> Dict[str, int]:
        """The launch options: num_warps, num_stages, and maxnreg when one is set (one dict per
        settings, made once: the launchers splat it at every call and never change it)."""
        options = _OPTIONS.get(self)
        if options is None:
            options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
            if self.maxnreg is not None:
                options["maxnreg"] = self.maxnreg
            _OPTIONS[self] = options
        return options


_OPTIONS: Dict[Settings, Dict[str, int]] = {}


class Dropout(NamedTuple):
    """A kernel's dropout arguments: HAS_DROPOUT, the Philox seed, the 24-bit keep threshold, the
    scale of what is kept."""

    on: bool
    seed: int
    threshold: int
    scale: float


_NO_DROPOUT = Dropout(False, 0, 0, 1.0)
_THRESHOLDS: Dict[float, Tuple[int, float]] = {}  # dropout_p -> (threshold, scale), a launch's host time saved


def dropout_options(dropout_p: float, seed: Optional[int], op: str) -> Dropout:
    """The dropout arguments of probability dropout_p; a seed in [0, 2**63) is needed when it is
    above 0 (op names the caller in the error)."""
    if dropout_p <= 0.0:
        return _NO_DROPOUT
    if seed is None:
        raise ValueError(f"fastbert: {op} with dropout_p > 0 needs a seed")
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"fastbert: dropout seed must be in [0, 2**63), got {seed}")
    known = _THRESHOLDS.get(dropout_p)
    if known is None:
        # imported here, not at the top: from the source tree this folder is also found as a top-level
        # package `kernels` (transformers probes for one by that name), where `..` reaches nothing
        from ..reference import dropout_threshold

        known = _THRESHOLDS[dropout_p] = (dropout_threshold(dropout_p),
                                          1.0 / (1.0 - dropout_p) if dropout_p < 1.0 else 0.0)
    return Dropout(True, int(seed), *known)


class KernelBuild(NamedTuple):
    """One compiled variant of a jit kernel, as a launcher can pick it.

    name:       short kernel name shown in the report ("bias_gelu_fwd")
    fn:         the @triton.jit function
    signature:  {arg name: triton type} for every runtime argument ("*fp16", "i32", "i64", "fp32")
    constexprs: {arg name: value} for every tl.constexpr argument
    num_warps, num_stages, maxnreg: launch options, as the launcher passes them (maxnreg None:
                not passed, ptxas picks the register budget)
    config:     the human-readable description of the variant, a flat dict of scalars
    divisible:  runtime arguments known to be multiples of 16 (pointers: 16-byte aligned), the
                specialization Triton's JIT makes for them at launch (see `aligned_args`)
    """

    name: str
    fn: Callable[..., Any]
    signature: Dict[str, str]
    constexprs: Dict[str, Any]
    num_warps: int
    num_stages: int
    config: Dict[str, Any]
    divisible: Tuple[str, ...] = ()
    maxnreg: Optional[int] = None


_SINKS: Dict[Any, Any] = {}  # device -> every sink buffer made on it, the newest last


def sink(numel: int, device):
    """A float32 buffer of at least `numel` elements on `device` for what a kernel must store and
    nobody reads (inference's LayerNorm statistics, attention's log-sum-exp), so that the launch
    allocates nothing for it: one per device, grown (doubling) to the largest size asked. Never
    read, so the calls that share it (on any stream, in a CUDA graph or not) cannot disturb one
    another. A buffer outgrown is kept, never freed: a CUDA graph captured with it writes to it at
    every replay, and freed memory would be handed to other tensors."""
    import torch

    made = _SINKS.setdefault(device, [])
    if not made or made[-1].numel() < numel:
        size = max(numel, 1024, 2 * made[-1].numel() if made else 0)
        made.append(torch.empty(size, dtype=torch.float32, device=device))
    return made[-1]


_APART = contextvars.ContextVar("fastbert_outputs_apart", default=False)


@contextlib.contextmanager
def outputs_apart():
    """Within the block, empty_together makes each tensor its own allocation: for a launcher called
    as a torch.library custom op's implementation, whose outputs torch requires not to share memory."""
    token = _APART.set(True)
    try:
        yield
    finally:
        _APART.reset(token)


def apart() -> bool:
    """Whether outputs must not share memory here (outputs_apart)."""
    return _APART.get()


def empty_together(count: int, shape, dtype, device):
    """`count` uninitialised contiguous tensors of one shape, dtype and device, views into one
    allocation (one call of the allocator and one unbind, not one allocation each: on a GPU each
    costs the host the caching allocator's bookkeeping), each 16-byte aligned, the specialization
    the kernels are built for. For outputs that die together or soon after one another (the memory
    is returned when the last of them dies). Apart (one allocation each) inside outputs_apart."""
    import torch

    if _APART.get():
        return tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(count))
    n = math.prod(shape)
    if n * dtype.itemsize % 16 == 0:
        return torch.empty((count, *shape), dtype=dtype, device=device).unbind(0)
    step = cdiv(n * dtype.itemsize, 16) * 16 // dtype.itemsize  # padded to keep the next part aligned
    rows = torch.empty((count, step), dtype=dtype, device=device).narrow(1, 0, n).unbind(0)
    return tuple(row.view(shape) for row in rows)


_PART_ALIGN = 256  # bytes: every part of empty_parts starts on a boundary of the GPU's widest loads


def empty_parts(parts, device):
    """Uninitialised contiguous tensors of the (shape, dtype) pairs `parts`, views into one
    allocation, each starting 256-byte aligned: what a layer's training step writes (outputs,
    statistics, partial sums of any dtypes and shapes) for one call of the allocator instead of one
    per tensor. The memory is returned when the last of them dies, so the parts must die together
    (a step's saved tensors and its output; a backward's gradients and scratch). Apart (one
    allocation each) inside outputs_apart."""
    import torch

    if _APART.get():
        return tuple(torch.empty(shape, dtype=dtype, device=device) for shape, dtype in parts)
    total, layout = _parts_layout(parts)
    memory = torch.empty(total, dtype=torch.uint8, device=device)
    typed: Dict[Any, Any] = {}  # one view of the memory per dtype; each part one as_strided of it
    out = []
    for dtype, shape, strides, offset in layout:
        whole = typed.get(dtype)
        if whole is None:
            whole = typed[dtype] = memory.view(dtype)
        out.append(whole.as_strided(shape, strides, offset))
    return tuple(out)


_LAYOUTS: Dict[Any, Any] = {}  # parts -> their layout (a step's parts repeat from step to step)
_LAYOUTS_LIMIT = 1024  # layouts kept before the table starts again (one per layer kind and batch shape)


def _parts_layout(parts):
    # (bytes, [(dtype, shape, contiguous strides, offset in elements)]) of empty_parts' parts, each
    # part's start rounded up to _PART_ALIGN; kept per parts (the arithmetic cost a call of the
    # allocator's size in host time)
    key = tuple(parts)
    try:
        found = _LAYOUTS.get(key)
    except TypeError:  # a shape given as a list: laid out, not kept
        key = found = None
    if found is None:
        total, layout = 0, []
        for shape, dtype in parts:
            strides, step = [], 1
            for size in reversed(shape):
                strides.append(step)
                step *= max(size, 1)
            layout.append((dtype, tuple(shape), tuple(strides[::-1]), total // dtype.itemsize))
            total += cdiv(math.prod(shape) * dtype.itemsize, _PART_ALIGN) * _PART_ALIGN
        found = (total, layout)
        if key is not None:
            if len(_LAYOUTS) >= _LAYOUTS_LIMIT:
                _LAYOUTS.clear()
            _LAYOUTS[key] = found
    return found


def fresh_or_given(given, shape, dtype, device, what: str, *, unit_columns: bool = False):
    """Where a launcher writes an output: a fresh tensor of `shape` and `dtype`, or `given` (memory a
    caller allocated with others, empty_parts) after checking that it is that: its shape, its dtype,
    contiguous (unit_columns: rows of unit column stride, as the kernel steps them); a one-line
    ValueError naming `what` otherwise."""
    import torch

    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    layout_ok = given.stride(-1) == 1 if unit_columns else given.is_contiguous()
    if tuple(given.shape) != tuple(shape) or given.dtype != dtype or not layout_ok:
        name = str(dtype).replace("torch.float", "fp").replace("torch.bfloat", "bf")
        layout = "with unit column stride" if unit_columns else "contiguous"
        raise ValueError(f"fastbert: {what} must be {name} {layout} {tuple(shape)}, got {given.dtype} "
                         f"{tuple(given.shape)}")
    return given


class Bound:
    """One kernel launch with all but its call's own values fixed: made once per specialization (the
    dtypes, flags and strides that do not change with the sizes), then called with the grid and
    those values only. What a launcher computes before a launch (checks, settings, the absent
    arguments' stand-ins, the options) and what @triton.heuristics computes at each call are
    computed here once, so that the host's work per launch is little more than the launch.

    kernel: the @triton.jit function (or a @triton.heuristics one over it: its values are computed
    here, from these arguments, so they must not depend on `varying`); args: the launch's positional
    arguments as a first call passes them; options: its keyword arguments (constexprs, launch
    options); varying: the names of the arguments each call gives (its tensors, sizes, strides that
    follow the sizes, seeds). Their first values are dropped here: a Bound keeps no call's tensor.
    Whoever keeps a Bound keys it on all that decides the other arguments."""

    __slots__ = ("_kernel", "_args", "_slots", "_options", "_direct")

    def __init__(self, kernel, args, options: Dict[str, Any], varying) -> None:
        options = dict(options)
        names = kernel.arg_names
        rules = getattr(kernel, "values", None)
        if rules is not None:  # @triton.heuristics: what its run computes at every call
            named = {**dict(zip(names, args)), **options}
            options.update({name: rule(named) for name, rule in rules.items()})
            kernel = kernel.fn
        self._kernel = kernel  # its run looked up at each call, never kept: a wrapper of it (the host counts) holds
        self._slots = tuple((names.index(name), name) for name in varying)
        self._args = list(args)
        for i, _ in self._slots:
            self._args[i] = None
        self._options = options
        # a compiled (not interpreted) kernel: launched without its JIT once compiled (DirectLaunch)
        self._direct = DirectLaunch(kernel, len(args), options, self._slots) if hasattr(kernel, "device_caches") else None

    def __call__(self, grid, values: Dict[str, Any]) -> None:
        """Launch on `grid` with `values`: {name: value} for every varying argument."""
        args = self._args.copy()
        for i, name in self._slots:
            args[i] = values[name]
        self._launch(grid, args)

    def run(self, grid, *values) -> None:
        """Launch on `grid` with the varying arguments' values in the order `varying` named them."""
        args = self._args.copy()
        for (i, _), value in zip(self._slots, values):
            args[i] = value
        self._launch(grid, args)

    def _launch(self, grid, args: list) -> None:
        if self._direct is None:
            self._kernel.run(*args, grid=grid, warmup=False, **self._options)
        else:
            self._direct.launch(grid, args)
            record = _RECORD.get()
            if record is not None:
                record.append((self, grid, args))

    @property
    def options(self) -> Dict[str, Any]:
        """The launch's keyword arguments (constexprs, launch options); not to be changed."""
        return self._options

    def variant(self, args: list):
        """What a launch of `args` (a recorded call's: launches_recorded) hands the driver, for a
        launcher outside Python (fastbert.ops.cuda_stack's C++ stacks): (function, threads, dynamic shared
        memory, forms), forms one (parameter kind, value, varying name or None) per positional
        argument, kind PARAM_KINDS' letter of the compiled kernel's parameter or "-" where the
        compiled kernel has none (a constexpr, or a value the JIT made one); None where that launch is
        not one a plain cuLaunchKernelEx makes (not compiled here, scratch memory, cluster, PDL or
        cooperative launch, shared memory past the opt-in limit, a parameter of another kind)."""
        compiled = None if self._direct is None else self._direct.compiled_for(args)
        if compiled is None:
            return None
        md = compiled.metadata
        num_warps, num_ctas, shared = md.num_warps, getattr(md, "num_ctas", 1), md.shared
        if (num_ctas != 1 or shared > 228 * 1024 or any(d != 1 for d in getattr(md, "cluster_dims", (1, 1, 1)))
                or getattr(md, "launch_pdl", False)
                or getattr(md, "launch_cooperative_grid", False) or getattr(md, "global_scratch_size", 0)
                or getattr(md, "profile_scratch_size", 0)):
            return None
        signature = list(compiled.src.signature.values())
        names = self._kernel.arg_names
        if len(signature) != len(names):
            return None
        varying = dict(self._slots)
        forms = []
        for i, value in enumerate(args):
            ty = signature[i]
            kind = "-" if ty == "constexpr" else PARAM_KINDS.get("*" if ty.startswith("*") else ty)
            if kind is None or (kind == "-" and i not in varying and hasattr(value, "data_ptr")):
                return None
            forms.append((kind, value, varying.get(i)))
        return compiled.function, 32 * num_warps, shared, tuple(forms)


# A compiled kernel's parameter types (Triton's signature names) as the C++ launcher packs them:
# p an 8-byte pointer, b 1 byte, i 4-byte int, l 8-byte int, f fp32 (a Python float narrowed), d fp64
PARAM_KINDS = {"*": "p", "i1": "b", "u1": "b", "i8": "b", "u8": "b", "i32": "i", "u32": "i", "i64": "l", "u64": "l",
               "fp32": "f", "f32": "f", "fp64": "d", "f64": "d"}

_RECORD = contextvars.ContextVar("fastbert_launches_recorded", default=None)


@contextlib.contextmanager
def launches_recorded():
    """Inside the block each Bound launch of a compiled kernel is recorded, in order: the list yielded
    gets (the Bound, its grid, its positional arguments) per launch (Bound.variant reads what it
    handed the driver); a recording around it gets them too, at its end."""
    record: list = []
    outer = _RECORD.get()
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)
        if outer is not None:  # a recording around this one gets these launches too
            outer.extend(record)


class DirectLaunch:
    """A Bound's (or a `launch` site's) compiled kernels, launched the way Triton's JIT launches them
    after its checks.

    A JITFunction call binds every argument, specializes each (its type, 16-byte alignment,
    divisibility by 16, the value 1) and hashes the options, some 30 arguments' worth of host work,
    before it hands the compiled kernel's launcher the arguments. A Bound's fixed arguments and
    options never change, so only its varying arguments' specialization can pick another compiled
    kernel: it is computed here per call with the JIT's own function (native_specialize_impl, with
    each parameter's flags, as the JIT's binder calls it) and looked up, with the current device,
    among the kernels the JIT compiled for this Bound (`keep`, after a call the JIT made). A hit
    launches that kernel through its launcher with the arguments the JIT would give it (every
    parameter in order, constexprs included; the device's current stream), and no launch metadata
    nor hooks, which the JIT builds for launch hooks alone; through the C launch of Triton's CUDA
    launcher itself where that launcher's Python would only hand it on (_c_launch); a miss, a
    launch hook (a profiler's) or Triton's debug mode (which the JIT's options carry) leaves the
    call to the JIT."""

    __slots__ = ("_kernel", "_options", "_full", "_spec", "_raw", "_compiled", "_backends", "_driver",
                 "_knobs", "_native")

    def __init__(self, kernel, n_args: int, options: Dict[str, Any], slots) -> None:
        from triton import knobs
        from triton.runtime.driver import driver
        from triton.runtime.jit import native_specialize_impl

        self._kernel, self._options = kernel, options
        self._driver, self._knobs, self._native = driver, knobs, native_specialize_impl
        params = kernel.params
        # the JIT's bound arguments in parameter order: the positional ones, then constexprs and
        # defaults by name (the launch options, num_warps and the like, are not parameters)
        self._full = [None] * n_args + [options[p.name] if p.name in options else p.default for p in params[n_args:]]
        specializers = []
        for i, _ in slots:
            kp = params[i]
            if kp.is_constexpr:  # its value is in the compiled kernel
                specializers.append((i, None))
                continue
            specialize = not kp.do_not_specialize
            annotated = kp.annotation_type if isinstance(kp.annotation_type, str) else ""
            if annotated and (annotated == "u1" or annotated[:2] in ("fp", "bf")):
                specialize = False  # the JIT does not specialize annotated floats and bools
            if annotated and not specialize:
                continue  # nothing of its value reaches the JIT's key
            specializers.append((i, (kp.is_const, specialize, not kp.do_not_specialize_on_alignment)))
        # column by column (index, is_const, specialize, align), for _key's maps: a generator's step per
        # argument cost the host more than the specialization calls themselves
        self._spec = tuple(zip(*[(i, *flags) for i, flags in specializers if flags is not None])) or ((),) * 4
        self._raw = tuple(i for i, flags in specializers if flags is None)
        # (device, each varying argument's specialization) -> (the compiled kernel, its C launch or None)
        self._compiled: Dict[Any, Any] = {}
        self._backends: Dict[Any, Any] = {}  # device -> the JIT's backend there (what specializes)

    def _key(self, device, backend, args) -> tuple:
        index, is_const, specialize, align = self._spec
        at = args.__getitem__
        return (device, *map(self._native, repeat(backend), map(at, index), is_const, specialize, align),
                *map(at, self._raw))

    def compiled_for(self, args):
        """The compiled kernel a launch of `args` runs here (on the current device), or None where the
        JIT has not compiled their specialization here yet."""
        found = self._found(self._driver.active.get_current_device(), args)
        return None if found is None else found[0]

    def _found(self, device, args):
        # (the compiled kernel, its C launch or None) kept for args' specialization on device, or None
        backend = self._backends.get(device)
        return None if backend is None else self._compiled.get(self._key(device, backend, args))

    def keep(self, args, compiled) -> None:
        """After the JIT launched `args` as `compiled` (its run's result): launch those directly."""
        if compiled is None:
            return
        device = self._driver.active.get_current_device()
        backend = self._backends.get(device)
        if backend is None:
            backend = self._backends[device] = self._kernel.device_caches[device][3]
        self._compiled[self._key(device, backend, args)] = (compiled, _c_launch(compiled.run))

    def __call__(self, grid, args) -> bool:
        """Launch args on grid if the JIT compiled their specialization here before; False if not."""
        if not _direct_allowed(self._knobs.runtime):
            return False
        active = self._driver.active
        device = active.get_current_device()
        found = self._found(device, args)
        if found is None:
            return False
        compiled, c_launch = found
        full = self._full.copy()
        full[:len(args)] = args
        n = len(grid)
        x, y, z, stream = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, active.get_current_stream(device)
        if c_launch is None:
            compiled.run(x, y, z, stream, compiled.function, compiled.packed_metadata, None, None, None, *full)
        else:
            launch, cooperative, pdl, annotations, signature = c_launch
            launch(x, y, z, stream, compiled.function, cooperative, pdl, compiled.packed_metadata, None, None, None,
                   None, None, annotations, signature, full)
        return True

    def launch(self, grid, args) -> None:
        """Launch args on grid: directly where the JIT compiled their specialization here before,
        else through the JIT (with the options given at construction), its kernel kept."""
        if not self(grid, args):
            self.keep(args, self._kernel.run(*args, grid=grid, warmup=False, **self._options))


def _c_launch(run):
    """For a compiled kernel whose launcher is Triton's CUDA one and needs no scratch memory: (its C
    launch, cooperative, PDL, argument annotations, kernel signature), what that launcher's Python
    hands its C launch with no scratch and no hooks (triton.backends.nvidia.driver.CudaLauncher),
    so that DirectLaunch calls the C launch itself (the launcher's Python, which allocates nothing
    here, cost a launch some 5 us of host time on a Zen 1: benchmarks/bench_launch.py). None for
    any other launcher, or one that allocates scratch or runs the sanitizer: called as it is."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:  # a Triton without its CUDA backend
        return None
    needed = ("launch", "launch_cooperative_grid", "launch_pdl", "arg_annotations", "kernel_signature",
              "global_scratch_size", "profile_scratch_size")
    if (not isinstance(run, CudaLauncher) or not all(hasattr(run, name) for name in needed)
            or run.global_scratch_size or run.profile_scratch_size or getattr(run, "gsan_enabled", False)):
        return None
    return run.launch, run.launch_cooperative_grid, run.launch_pdl, run.arg_annotations, run.kernel_signature


# (id of the kernel, its options' items) -> its direct launches; the entry holds the kernel, so its id
# is never another's (a JITFunction's own hash computes its cache key: a launch's host time saved)
_LAUNCHES: Dict[Any, "DirectLaunch"] = {}


def launch(kernel, grid, args, options: Dict[str, Any]) -> None:
    """kernel[grid](*args, **options), the launchers' every unbound launch: a compiled kernel whose
    specialization was launched here before is launched directly (DirectLaunch, one per kernel and
    options: its constexprs and launch options, which a call site passes in one order), the rest
    through Triton's JIT, as are the interpreter's kernels (which bench_host counts there)."""
    if not hasattr(kernel, "device_caches"):
        kernel.run(*args, grid=grid, warmup=False, **options)
        return
    key = (id(kernel), *options.items())
    direct = _LAUNCHES.get(key)
    if direct is None:
        direct = _LAUNCHES[key] = DirectLaunch(kernel, len(args), options, tuple(enumerate(kernel.arg_names[:len(args)])))
    direct.launch(grid, args)


def launch_target() -> Optional[Tuple[int, int]]:
    """(the current device, its current stream): where Triton's launches go now; None where a launch
    must go through Triton's JIT (a launch hook is set, a profiler's, or Triton's debug mode is on),
    as DirectLaunch leaves such launches to it."""
    from triton import knobs
    from triton.runtime.driver import driver

    if not _direct_allowed(knobs.runtime):
        return None
    active = driver.active
    device = active.get_current_device()
    return device, active.get_current_stream(device)


_DRIVER_LAUNCH: list = []  # the driver's cuLaunchKernelEx address (0: no driver here), found once a process


def driver_launch_address() -> int:
    """The address of the loaded CUDA driver's cuLaunchKernelEx, what Triton's launcher calls (0 where
    no libcuda loads: no GPU driver on this machine)."""
    if not _DRIVER_LAUNCH:
        import ctypes

        try:
            address = ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx, ctypes.c_void_p).value or 0
        except (OSError, AttributeError):
            address = 0
        _DRIVER_LAUNCH.append(address)
    return _DRIVER_LAUNCH[0]


def _direct_allowed(runtime) -> bool:
    """Whether a launch may skip Triton's JIT (triton's knobs.runtime): no launch hook (a profiler's),
    not Triton's debug mode (which the JIT's options carry)."""
    return _idle(runtime.launch_enter_hook) and _idle(runtime.launch_exit_hook) and not runtime.debug


def _idle(hook) -> bool:
    """Whether a Triton launch hook does nothing: None, or a chain of no hooks (triton 3.9's
    knobs.runtime.launch_enter_hook, which a profiler fills)."""
    return hook is None or getattr(hook, "calls", None) == []


def aligned_args(signature: Dict[str, str]) -> Tuple[str, ...]:
    """The arguments the JIT marks divisible by 16 for an aligned problem (contiguous [M, N]
    tensors with N % 16 == 0, fresh allocations): every pointer, every stride_* and N."""
    return tuple(name for name, ty in signature.items()
                 if ty.startswith("*") or (ty in ("i32", "i64") and (name.startswith("stride") or name == "N")))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of ints, as triton.cdiv gives it: the launchers' grids and splits call this one,
    because triton's is a constexpr_function, whose call from the host costs several microseconds
    (its arguments unwrapped one by one), and the host is the cost on a GPU (benchmarks/bench_host.py)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (0 for n <= 0), as triton.next_power_of_2 gives it (see cdiv)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


_SM_COUNTS: Dict[Any, int] = {}  # device -> its count, read once (launchers ask at every call)


def num_sms(device) -> int:
    """Streaming multiprocessors of `device`; 132 (an H100) for CPU tensors under the interpreter,
    so the interpreter splits work the way a large GPU would."""
    count = _SM_COUNTS.get(device)
    if count is None:
        import torch

        device = torch.device(device)
        count = 132
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            count = torch.cuda.get_device_properties(index).multi_processor_count
        if device.type != "cuda" or device.index is not None:  # "cuda" alone follows the current device
            _SM_COUNTS[device] = count
    return count


def split_rows(n_rows: int, block_m: int, max_programs: int):
    """Split n_rows into at most max_programs contiguous chunks of whole BLOCK_M blocks.

    Returns (rows_per_program, n_programs): rows_per_program is a multiple of block_m and
    n_programs * rows_per_program >= n_rows > (n_programs - 1) * rows_per_program, so every
    program gets at least one row. The split depends only on its arguments, which keeps the
    per-program partial sums (and so the reduced gradients) deterministic.
    """
    n_blocks = -(-n_rows // block_m)
    blocks_per_program = -(-n_blocks // max(1, min(n_blocks, max_programs)))
    rows_per_program = blocks_per_program * block_m
    return rows_per_program, -(-n_rows // rows_per_program)
