"""fastbert: BERT on hand-written fused kernels (Triton on GPU, fused C++ on CPU)."""
from fastbert import data, masking, ops, reference
from fastbert.backend import BACKENDS
from fastbert.cross_encoder import CrossEncoder
from fastbert.hf import patch, patch_transformers
from fastbert.maps import attention_map
from fastbert.model import (  # the other families and the Auto classes
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    CamembertConfig,
    CamembertForMaskedLM,
    CamembertForQuestionAnswering,
    CamembertForSequenceClassification,
    CamembertForTokenClassification,
    CamembertModel,
    DistilBertConfig,
    DistilBertForMaskedLM,
    DistilBertForQuestionAnswering,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraForQuestionAnswering,
    ElectraForSequenceClassification,
    ElectraForTokenClassification,
    ElectraModel,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
    XLMRobertaForQuestionAnswering,
    XLMRobertaForSequenceClassification,
    XLMRobertaForTokenClassification,
    XLMRobertaModel,
)
from fastbert.sentence import SentenceEncoder

__version__ = "0.1.0"

__all__ = [
    "ops", "reference", "masking", "data", "BACKENDS", "__version__",
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "SentenceEncoder", "CrossEncoder", "attention_map",
    "patch", "patch_transformers",
    "RobertaConfig", "XLMRobertaConfig", "CamembertConfig", "ElectraConfig", "AutoConfig", "AutoModel",
    "AutoModelForMaskedLM", "AutoModelForPreTraining", "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification", "AutoModelForTokenClassification", "RobertaModel",
    "RobertaForMaskedLM", "RobertaForSequenceClassification", "RobertaForTokenClassification",
    "RobertaForQuestionAnswering", "XLMRobertaModel", "XLMRobertaForMaskedLM",
    "XLMRobertaForSequenceClassification", "XLMRobertaForTokenClassification", "XLMRobertaForQuestionAnswering",
    "CamembertModel", "CamembertForMaskedLM", "CamembertForSequenceClassification",
    "CamembertForTokenClassification", "CamembertForQuestionAnswering", "ElectraModel", "ElectraForPreTraining",
    "ElectraForMaskedLM", "ElectraForSequenceClassification", "ElectraForTokenClassification",
    "ElectraForQuestionAnswering", "DistilBertConfig", "DistilBertModel", "DistilBertForMaskedLM",
    "DistilBertForSequenceClassification", "DistilBertForTokenClassification", "DistilBertForQuestionAnswering",
]
