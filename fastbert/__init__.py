"""fastbert: BERT on hand-written fused kernels (Triton on GPU, fused C++ on CPU)."""
from fastbert import ops, reference
from fastbert.backend import BACKENDS

__version__ = "0.1.0"

__all__ = ["ops", "reference", "BACKENDS", "__version__"]
