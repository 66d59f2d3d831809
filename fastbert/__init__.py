"""fastbert: BERT on hand-written fused kernels (Triton on GPU, fused C++ on CPU)."""
from fastbert import data, masking, model, ops, reference
from fastbert.attention_maps import attention_map
from fastbert.backend import BACKENDS
from fastbert.cross_encoder import CrossEncoder
from fastbert.hf import patch, patch_transformers
from fastbert.model import *  # noqa: F403 (the configs, models, heads and Auto classes: fastbert.model.__all__)
from fastbert.sentence import SentenceEncoder

__version__ = "0.1.0"

__all__ = [
    "ops", "reference", "masking", "data", "BACKENDS", "__version__", "SentenceEncoder", "CrossEncoder",
    "attention_map", "patch", "patch_transformers",
]
__all__ += model.__all__
