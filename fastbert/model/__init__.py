"""BERT on fastbert's fused ops, a drop-in for transformers' BERT classes (see bert.py for the
data flow): config.py, outputs.py, layers.py, pretrained.py (loading and saving), checkpoint.py
(transformers' checkpoint files), checks.py (input errors), bert.py (BertModel), heads.py (the task
models), quantize.py (int8 inference: quantize_ and the int8 encoder); the other families as adapters of the same
encoder: roberta.py (RoBERTa, XLM-RoBERTa, CamemBERT), electra.py, distilbert.py; ModernBERT (pre-LN, rotary and
local attention, GeGLU: a layer of its own on the same ops): modernbert.py and modernbert_heads.py; MPNet (a relative
position bias in every layer's attention): mpnet.py; GTE (BERT's layer with rotary positions and a gated
feed-forward): gte.py, NomicBERT (GTE's layer without biases): nomic_bert.py, Jina embeddings v3 (GTE's
layer with BERT's feed-forward, RoBERTa's heads): jina_embeddings_v3.py; EuroBERT (a Llama-style pre-norm
encoder: RMSNorm, rotary, SwiGLU, grouped-query attention): eurobert.py; prenorm.py (the base model's forward
of the two pre-norm families); DeBERTa-v2 / v3 (BERT's layer with the disentangled attention): deberta_v2.py;
lora.py (task adapters: Jina v3's); auto.py (the class for a model_type)."""
from fastbert.model.auto import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from fastbert.model.bert import BertModel
from fastbert.model.config import (
    BertConfig,
    CamembertConfig,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    EuroBertConfig,
    GteConfig,
    JinaEmbeddingsV3Config,
    ModernBertConfig,
    MPNetConfig,
    NomicBertConfig,
    RobertaConfig,
    XLMRobertaConfig,
)
from fastbert.model.deberta_v2 import (
    DebertaV2ForMaskedLM,
    DebertaV2ForMultipleChoice,
    DebertaV2ForQuestionAnswering,
    DebertaV2ForSequenceClassification,
    DebertaV2ForTokenClassification,
    DebertaV2Model,
)
from fastbert.model.distilbert import (
    DistilBertForMaskedLM,
    DistilBertForQuestionAnswering,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
)
from fastbert.model.electra import (
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraForQuestionAnswering,
    ElectraForSequenceClassification,
    ElectraForTokenClassification,
    ElectraModel,
)
from fastbert.model.eurobert import (
    EuroBertForMaskedLM,
    EuroBertForSequenceClassification,
    EuroBertForTokenClassification,
    EuroBertModel,
)
from fastbert.model.gte import (
    GteForMaskedLM,
    GteForSequenceClassification,
    GteForTokenClassification,
    GteModel,
)
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from fastbert.model.jina_embeddings_v3 import (
    JinaEmbeddingsV3ForMaskedLM,
    JinaEmbeddingsV3ForQuestionAnswering,
    JinaEmbeddingsV3ForSequenceClassification,
    JinaEmbeddingsV3ForTokenClassification,
    JinaEmbeddingsV3Model,
)
from fastbert.model.modernbert import ModernBertModel
from fastbert.model.modernbert_heads import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
)
from fastbert.model.mpnet import (
    MPNetForMaskedLM,
    MPNetForQuestionAnswering,
    MPNetForSequenceClassification,
    MPNetForTokenClassification,
    MPNetModel,
)
from fastbert.model.nomic_bert import (
    NomicBertForMaskedLM,
    NomicBertForSequenceClassification,
    NomicBertForTokenClassification,
    NomicBertModel,
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
from fastbert.model.roberta import (
    CamembertForMaskedLM,
    CamembertForQuestionAnswering,
    CamembertForSequenceClassification,
    CamembertForTokenClassification,
    CamembertModel,
    RobertaForMaskedLM,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
    XLMRobertaForMaskedLM,
    XLMRobertaForQuestionAnswering,
    XLMRobertaForSequenceClassification,
    XLMRobertaForTokenClassification,
    XLMRobertaModel,
)

__all__ = [
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "BertPreTrainedModel",
    "BaseModelOutputWithPooling", "BertForPreTrainingOutput", "MaskedLMOutput", "SequenceClassifierOutput",
    "TokenClassifierOutput", "QuestionAnsweringModelOutput",
]
# the other families and the Auto classes
__all__ += [
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
    "ModernBertConfig", "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification", "ModernBertForQuestionAnswering",
    "MPNetConfig", "MPNetModel", "MPNetForMaskedLM", "MPNetForSequenceClassification", "MPNetForTokenClassification",
    "MPNetForQuestionAnswering", "GteConfig", "GteModel", "GteForMaskedLM", "GteForSequenceClassification",
    "GteForTokenClassification", "NomicBertConfig", "NomicBertModel", "NomicBertForMaskedLM",
    "NomicBertForSequenceClassification", "NomicBertForTokenClassification", "JinaEmbeddingsV3Config",
    "JinaEmbeddingsV3Model", "JinaEmbeddingsV3ForMaskedLM", "JinaEmbeddingsV3ForSequenceClassification",
    "JinaEmbeddingsV3ForTokenClassification", "JinaEmbeddingsV3ForQuestionAnswering", "EuroBertConfig",
    "EuroBertModel", "EuroBertForMaskedLM", "EuroBertForSequenceClassification", "EuroBertForTokenClassification",
    "DebertaV2Config", "DebertaV2Model", "DebertaV2ForMaskedLM", "DebertaV2ForSequenceClassification",
    "DebertaV2ForTokenClassification", "DebertaV2ForQuestionAnswering", "DebertaV2ForMultipleChoice",
]
