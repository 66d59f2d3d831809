"""Backend selection: the one place that knows which implementations are present.

Every op in `fastbert.ops` runs on one of three backends (see DESIGN.md):
  "triton"  CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 was set before triton was imported
  "cpp"     CPU tensors, the fused C++ kernels of the extension fastbert._C
  "torch"   anywhere, the reference layers of fastbert.reference
Optional imports (triton, the extension) are guarded here and nowhere else.

The "cpp" kernels are compiled once per instruction-set level (setup.py builds one library per
level: "scalar", "avx2", "avx512", "avx512_vnni", and "native" when asked for; the level "amx" has
no library: avx512_vnni's kernels with the packed int8 GEMM on AMX's tiles); when fastbert is
imported, the highest level this CPU runs is loaded, or the highest at or below
FASTBERT_CPU_CAPABILITY when that is set (for tests, and to reproduce another machine).
`cpu_capability()` says which runs, `cpu_capabilities()` which could.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import platform
import warnings
from typing import Iterator, List, Optional

import torch

BACKENDS = ("triton", "cpp", "torch")


_UNKNOWN = object()
_cpp = _UNKNOWN
_triton = _UNKNOWN


def cpp_extension():
    """The compiled extension fastbert._C with the kernels of this CPU's level loaded, or None (with
    one warning) when it was not built."""
    global _cpp
    if _cpp is _UNKNOWN:
        try:
            from fastbert import _C as ext

            _use_level(ext, _pick_level(ext))
        except ImportError as exc:
            warnings.warn(
                f"fastbert: the C++ extension fastbert._C is not available ({exc}); CPU ops fall back to "
                "the 'torch' backend. Rebuild with: pip install --no-build-isolation -e .",
                RuntimeWarning,
                stacklevel=3,
            )
            ext = None
        _cpp = ext
    return _cpp


# The kernel libraries' levels, lowest first; each of FULL_LEVELS holds every kernel, the others add to the
# one below them (avx512_vnni: the int8 GEMM; amx: no library, the tiles under avx512_vnni's int8 GEMM).
LEVELS = ("scalar", "avx2", "avx512", "avx512_vnni", "amx", "native")
FULL_LEVELS = ("scalar", "avx2", "avx512", "native")
NO_LIBRARY = {"amx": "avx512_vnni"}  # a level without a library of its own: the level it stands over


def library(level: str) -> Optional[str]:
    """The path of the kernel library of `level`, None when this build has none."""
    try:
        spec = importlib.util.find_spec(f"fastbert._kernels_{level}")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin and os.path.exists(spec.origin) else None


_runnable_levels: List[List[str]] = []


def _runnable(ext) -> List[str]:
    """The levels this CPU runs and this build has, lowest first ("native" when it was built for a
    CPU like this one: loading it checks); found once."""
    if not _runnable_levels:
        levels = []
        for lv in ext.cpu_levels():
            if library(lv) is not None or NO_LIBRARY.get(lv) in levels:
                levels.append(lv)
        if library("native") is not None:
            try:
                ext.use_kernels(["native"], [library("native")])
                levels.append("native")
            except RuntimeError as exc:  # built on another machine
                warnings.warn(f"fastbert: the native kernel library does not run here ({exc})", RuntimeWarning,
                              stacklevel=4)
        _runnable_levels.append(levels)
    return _runnable_levels[0]


def _pick_level(ext) -> str:
    """The highest runnable level, at or below FASTBERT_CPU_CAPABILITY when that is set."""
    levels = _runnable(ext)
    if not levels:
        raise ImportError("fastbert._C has no kernel library for this CPU (fastbert/_kernels_*.so); rebuild with: "
                          "pip install --no-build-isolation -e .")
    cap = os.environ.get("FASTBERT_CPU_CAPABILITY") or None
    if cap is None:
        return levels[-1]
    if cap not in LEVELS:
        raise ValueError(f"fastbert: FASTBERT_CPU_CAPABILITY={cap!r} is not a level; choose one of {LEVELS}")
    return [lv for lv in levels if LEVELS.index(lv) <= LEVELS.index(cap)][-1]


def _use_level(ext, level: str) -> None:
    """Run the kernels of `level`: its library over the full library below it (and what lies between)."""
    runnable = _runnable(ext)
    chain = runnable[:runnable.index(level) + 1]
    first = max(i for i, lv in enumerate(chain) if lv in FULL_LEVELS)
    chain = chain[first:]
    ext.use_kernels(chain, ["" if lv in NO_LIBRARY else library(lv) for lv in chain])


def cpu_capability() -> Optional[str]:
    """The instruction-set level the C++ kernels run at ("scalar", "avx2", "avx512", "avx512_vnni",
    "amx" or "native"), None when the extension is not built."""
    ext = cpp_extension()
    return None if ext is None else ext.kernel_level()


def cpu_capabilities() -> List[str]:
    """Every level the C++ kernels can run at on this machine, lowest first ([] without the extension)."""
    ext = cpp_extension()
    return [] if ext is None else list(_runnable(ext))


def set_cpu_capability(level: str) -> str:
    """Run the C++ kernels at `level` (one of cpu_capabilities()) from now on; returns the previous level."""
    ext = cpp_extension()
    if ext is None:
        raise RuntimeError("fastbert: the C++ extension fastbert._C is not built; there is no level to set")
    levels = cpu_capabilities()
    if level not in levels:
        raise ValueError(f"fastbert: cpu capability {level!r} does not run here; choose one of {levels}")
    previous = ext.kernel_level()
    _use_level(ext, level)
    return previous


def cpu_features() -> List[str]:
    """The instruction-set extensions of this CPU fastbert knows of ("avx2", "avx512", "avx512_vnni",
    "avx512_bf16", "amx"); [] without the extension."""
    ext = cpp_extension()
    return [] if ext is None else list(ext.cpu_features())


def native_bf16() -> Optional[bool]:
    """Whether this CPU multiplies bf16 matrices natively (AVX512_BF16 or AMX), as seen at the kernel
    level in use (a level capped below avx512 stands for a CPU without them); None where fastbert
    cannot tell (no extension, or not an x86 CPU)."""
    level = cpu_capability()
    if level is None or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    if LEVELS.index(level) < LEVELS.index("avx512"):
        return False
    return bool({"avx512_bf16", "amx"} & set(cpu_features()))


@contextlib.contextmanager
def cpu_capability_scope(level: str) -> Iterator[None]:
    """Run the C++ kernels at `level` inside the block."""
    previous = set_cpu_capability(level)
    try:
        yield
    finally:
        set_cpu_capability(previous)


def triton_available() -> bool:
    """True when triton imports (it is optional: CPU-only installs need not have it)."""
    global _triton
    if _triton is _UNKNOWN:
        try:
            import triton  # noqa: F401

            _triton = True
        except Exception:
            _triton = False
    return _triton


def triton_interpreting() -> bool:
    """True when triton runs kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve(backend: Optional[str], t: torch.Tensor) -> str:
    """The backend that runs an op on tensor `t`: `backend` checked, or the automatic choice."""
    if backend is None:
        backend = os.environ.get("FASTBERT_BACKEND") or None
    if backend is None:
        if t.is_cuda:
            return "triton" if triton_available() else "torch"
        return "cpp" if cpp_extension() is not None else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"fastbert: unknown backend {backend!r}; choose one of {BACKENDS} or None")
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("fastbert: backend='triton' needs the triton package (pip install triton)")
        if not t.is_cuda and not (t.device.type == "cpu" and triton_interpreting()):
            raise RuntimeError(
                f"fastbert: backend='triton' got tensors on {t.device}; it needs CUDA tensors, or "
                "TRITON_INTERPRET=1 set in the environment before triton is imported to run the "
                "kernels on the CPU through the interpreter"
            )
    elif backend == "cpp":
        if t.device.type != "cpu":
            raise RuntimeError(f"fastbert: backend='cpp' runs on CPU tensors, got tensors on {t.device}")
        if cpp_extension() is None:
            raise RuntimeError(
                "fastbert: backend='cpp' asked for but the C++ extension fastbert._C is not built; "
                "reinstall with: pip install --no-build-isolation -e ."
            )
    return backend


def cpp_available() -> bool:
    """True when the extension is built (it warns once when it is not)."""
    return cpp_extension() is not None


_predates = set()


def cpp_function(name: str):
    """The extension's function `name`, or None when the extension is not built or predates it
    (then with one warning per function)."""
    ext = cpp_extension()
    if ext is None:
        return None
    fn = getattr(ext, name, None)
    if fn is None and name not in _predates:
        _predates.add(name)
        warnings.warn(
            f"fastbert: the built extension fastbert._C predates {name}; it runs in plain PyTorch. "
            "Rebuild with: pip install --no-build-isolation -e .",
            RuntimeWarning,
            stacklevel=3,
        )
    return fn


def cpu_only(backend: Optional[str], t: torch.Tensor):
    """The extension, for an op with C++ kernels and no Triton ones (int8 inference), when they run
    it: backend "cpp", or the automatic choice on a CPU tensor with the extension built. None when
    its reference runs instead ("torch"; "triton" and tensors on other devices, which have no such
    kernels)."""
    if backend == "triton" or (backend is None and t.device.type != "cpu"):
        return None
    return cpp_extension() if resolve(backend, t) == "cpp" else None


_TRITON_MODULES: dict = {}  # kernel module name -> fastbert.kernels.<name>, imported once


def impl(backend: str, kernel_module: str):
    """The module holding the `<op>_forward` / `<op>_backward` launchers of a fused backend:
    the extension for "cpp", fastbert.kernels.<kernel_module> for "triton" (looked up in a dict
    after its first import: every launch on a GPU asks, and the host's time is the GPU's wait)."""
    if backend == "cpp":
        return cpp_extension()
    if backend == "triton":
        module = _TRITON_MODULES.get(kernel_module)
        if module is None:
            module = _TRITON_MODULES[kernel_module] = importlib.import_module(f"fastbert.kernels.{kernel_module}")
        return module
    raise AssertionError(f"no fused launchers for backend {backend!r}")


# torch runs its float unary ops (exp, cos, tanh, sqrt, ...) through MKL's vector math, each thread on
# its own chunk. MKL picks each function's kernel on the function's first call, and first calls racing
# on several threads can run one thread's chunk on a low-accuracy kernel: a fresh process's first
# sizable exp or cos then has relative errors up to 1.5e-4 on half its elements (pytorch/pytorch#188792;
# seen in 4-12% of fresh processes on a 2-thread Xeon, torch 2.13). One call of each on a single
# element, on this thread alone, settles every pick before any parallel use.
VECTOR_MATH = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "expm1", "log", "log10", "log1p", "log2",
               "sin", "sqrt", "tan", "tanh", "trunc")


def settle_vector_math() -> None:
    """Call each of torch's MKL vector-math functions once, single-threaded, in float32 and float64
    (done when fastbert is imported; see VECTOR_MATH)."""
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            x = torch.full((1,), 0.5, dtype=dtype)
            for name in VECTOR_MATH:
                getattr(torch, name)(x)


settle_vector_math()


def load_if_built() -> None:
    """Load the extension and its kernel level now when it was built (done when fastbert is
    imported): a first use inside torch.compile's trace would break the graph, since dynamo cannot
    trace the library's loading. When it was not built, the first op that would run it warns; a
    FASTBERT_CPU_CAPABILITY that names no level leaves the import alone, and that op says so."""
    if importlib.util.find_spec("fastbert._C") is not None:
        try:
            cpp_extension()
        except ValueError:
            pass


load_if_built()


def describe() -> str:
    """Which implementations run here: the backends, the CPU's extensions and the C++ kernel levels."""
    lines = [f"backends: triton {'available' if triton_available() else 'not installed'}"
             f"{' (interpreted on the CPU)' if triton_interpreting() else ''}, cpp "
             f"{'built' if cpp_available() else 'not built'}, torch"]
    if cpp_available():
        cap = os.environ.get("FASTBERT_CPU_CAPABILITY")
        lines += [f"CPU extensions: {', '.join(cpu_features()) or 'none of avx2, avx512, avx512_vnni, avx512_bf16, amx'}",
                  f"C++ kernel levels this CPU runs: {', '.join(cpu_capabilities())}",
                  f"C++ kernels run at: {cpu_capability()}" + (f" (FASTBERT_CPU_CAPABILITY={cap})" if cap else ""),
                  f"native bf16 matrix products: {native_bf16()}",
                  "bf16 attention's products: " + ("bf16 (the BLAS's bf16 GEMM) from a sequence length timed here, fp32 below"
                                                   if cpp_extension().attention_bf16_available() else "fp32"),
                  "int8 products on a packed weight: " + ("AMX's tiles (whole blocks of 16 rows), AVX-512 VNNI for the rest"
                                                          if cpp_extension().int8_amx() else "vector kernels")]
    return "\n".join(lines)
