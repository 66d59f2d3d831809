"""BERT on fastbert's fused ops, a drop-in for transformers' BERT classes."""
from fastbert.model.bert import *  # noqa: F401,F403
from fastbert.model.bert import __all__  # noqa: F401
