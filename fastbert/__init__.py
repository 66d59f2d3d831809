"""fastbert: BERT on hand-written fused kernels (Triton on GPU, fused C++ on CPU)."""
from fastbert import data, masking, ops, reference
from fastbert.backend import BACKENDS
from fastbert.maps import attention_map
from fastbert.model import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from fastbert.sentence import SentenceEncoder

__version__ = "0.1.0"

__all__ = [
    "ops", "reference", "masking", "data", "BACKENDS", "__version__",
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "SentenceEncoder", "attention_map",
]
