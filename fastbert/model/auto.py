"""fastbert.AutoModel and the task Auto classes: the fastbert class for a config's model_type, as
transformers' Auto classes pick theirs."""
from __future__ import annotations

from typing import Dict

from fastbert.model import (
    deberta_v2,
    distilbert,
    electra,
    eurobert,
    gte,
    jina_embeddings_v3,
    modernbert_heads,
    mpnet,
    nomic_bert,
    roberta,
)
from fastbert.model.bert import BertModel
from fastbert.model.config import read_config
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

TASKS = ("model", "masked-lm", "sequence-classification", "token-classification", "question-answering")


def _family(*classes) -> Dict[str, type]:
    """{task: class} of a family's classes, given in TASKS' order (a family with fewer has none for
    the last tasks: GTE has no question-answering head)."""
    return dict(zip(TASKS, classes))


# model_type -> {task: class}
FAMILIES: Dict[str, Dict[str, type]] = {
    "bert": _family(BertModel, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
                    BertForQuestionAnswering),
    "roberta": _family(*roberta.ROBERTA_CLASSES),
    "xlm-roberta": _family(roberta.XLMRobertaModel, roberta.XLMRobertaForMaskedLM,
                           roberta.XLMRobertaForSequenceClassification, roberta.XLMRobertaForTokenClassification,
                           roberta.XLMRobertaForQuestionAnswering),
    "camembert": _family(roberta.CamembertModel, roberta.CamembertForMaskedLM,
                         roberta.CamembertForSequenceClassification, roberta.CamembertForTokenClassification,
                         roberta.CamembertForQuestionAnswering),
    "distilbert": _family(*distilbert.DISTILBERT_CLASSES),
    "electra": _family(electra.ElectraModel, electra.ElectraForMaskedLM, electra.ElectraForSequenceClassification,
                       electra.ElectraForTokenClassification, electra.ElectraForQuestionAnswering),
    "modernbert": _family(*modernbert_heads.MODERNBERT_CLASSES),
    "mpnet": _family(*mpnet.MPNET_CLASSES),
    "gte": _family(*gte.GTE_CLASSES),
    "nomic_bert": _family(*nomic_bert.NOMIC_BERT_CLASSES),
    "jina_embeddings_v3": _family(*jina_embeddings_v3.JINA_EMBEDDINGS_V3_CLASSES),
    "eurobert": _family(*eurobert.EUROBERT_CLASSES),
    "deberta-v2": _family(*deberta_v2.DEBERTA_V2_CLASSES),
}
# as transformers' AutoModelForPreTraining: the families without a pretraining head of their own train MLM
PRETRAINING = {**{family: classes["masked-lm"] for family, classes in FAMILIES.items()},
               "bert": BertForPreTraining, "electra": electra.ElectraForPreTraining}


class _Auto:
    """from_pretrained(dir, ...) / from_config(config): the family's class for this task (a
    subclass names its task: class AutoModelForMaskedLM(_Auto, task="masked-lm"))."""

    task: str

    def __init_subclass__(cls, *, task: str, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.task = task

    def __init__(self, *args, **kwargs):
        raise EnvironmentError(f"fastbert.{type(self).__name__} is built with {type(self).__name__}.from_pretrained(dir) "
                               f"or {type(self).__name__}.from_config(config)")

    @classmethod
    def classes(cls) -> Dict[str, type]:
        """{model_type: the class for this task} (the families that have one)."""
        return {model_type: family[cls.task] for model_type, family in FAMILIES.items() if cls.task in family}

    @classmethod
    def class_for(cls, model_type: str, where: str = "") -> type:
        classes = cls.classes()
        if model_type not in classes:
            raise ValueError(f"fastbert.{cls.__name__}: {where}model_type {model_type!r} is not supported; "
                             f"supported: {', '.join(sorted(classes))}")
        return classes[model_type]

    @classmethod
    def from_pretrained(cls, path: str, *args, **kwargs):
        """The family's class from_pretrained(path, ...), by config.json's model_type (or that of
        config=, when given)."""
        config = kwargs.get("config")
        if config is not None:
            model_type = config.model_type
            where = ""
        else:
            file, d = read_config(path, f"fastbert.{cls.__name__}")
            model_type, where = d.get("model_type"), f"{file}: "
        return cls.class_for(model_type, where).from_pretrained(path, *args, **kwargs)

    @classmethod
    def from_config(cls, config):
        """A freshly initialised model of the family's class for `config` (a fastbert config)."""
        return cls.class_for(config.model_type)(config)


class AutoModel(_Auto, task="model"): ...
class AutoModelForMaskedLM(_Auto, task="masked-lm"): ...
class AutoModelForSequenceClassification(_Auto, task="sequence-classification"): ...
class AutoModelForTokenClassification(_Auto, task="token-classification"): ...
class AutoModelForQuestionAnswering(_Auto, task="question-answering"): ...


class AutoModelForPreTraining(_Auto, task="pretraining"):
    @classmethod
    def classes(cls) -> Dict[str, type]:
        return dict(PRETRAINING)


class AutoConfig:
    """from_pretrained(dir): the family's config class read from config.json."""

    def __init__(self, *args, **kwargs):
        raise EnvironmentError("fastbert.AutoConfig is built with AutoConfig.from_pretrained(dir)")

    @classmethod
    def from_pretrained(cls, path: str):
        file, d = read_config(path, "fastbert.AutoConfig")
        return AutoModel.class_for(d.get("model_type"), f"{file}: ").config_class.from_dict(d)
