"""Plain PyTorch reference layers: the ground truth every kernel is tested against."""
from fastbert.reference.attention import *  # noqa: F401,F403
