"""BERT on fastbert's fused ops, a drop-in for transformers' BERT classes (see bert.py for the
data flow): config.py, outputs.py, layers.py, pretrained.py (loading and saving), checkpoint.py
(transformers' checkpoint files), checks.py (input errors), bert.py (BertModel), heads.py (the task
models), int8.py (int8 inference: quantize_ and the int8 encoder)."""
from fastbert.model.bert import BertModel
from fastbert.model.config import BertConfig
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from fastbert.model.outputs import (
    BaseModelOutputWithPooling,
    BertForPreTrainingOutput,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from fastbert.model.pretrained import BertPreTrainedModel

__all__ = [
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "BertPreTrainedModel",
    "BaseModelOutputWithPooling", "BertForPreTrainingOutput", "MaskedLMOutput", "SequenceClassifierOutput",
    "TokenClassifierOutput", "QuestionAnsweringModelOutput",
]
