"""BertConfig: the fields of transformers' BertConfig, read from and written to config.json."""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

from fastbert.ops.bias_gelu import GELU_FORMS

CONFIG_NAME = "config.json"
# activations other than the GELU forms of fastbert.ops.bias_gelu, run unfused
OTHER_ACTIVATIONS = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh}



def read_config(path: str, where: str):
    """(the file, its dict) of a config.json, or of the one in directory `path`."""
    file = os.path.join(path, CONFIG_NAME) if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{where}: no {CONFIG_NAME} at {path}")
    try:
        with open(file, encoding="utf-8") as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: {file} is not valid JSON ({e})") from None
    if d.get("model_type") == "xlm-roberta" and d.get("position_embedding_type") == "rotary":
        # jina-embeddings-v3's original files (its remote code's XLMRobertaLoRA): XLM-R with rotary
        # positions and task adapters is the model transformers names jina_embeddings_v3
        d = {**d, "model_type": JinaEmbeddingsV3Config.model_type}
    return file, d


class BertConfig:
    """The fields of transformers' BertConfig, with its defaults (BERT-base). Unknown keys are
    kept as attributes and written back, as transformers does, so a config round-trips."""

    model_type = "bert"
    _defaults: Dict[str, Any] = dict(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=2,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        position_embedding_type="absolute",
        use_cache=True,
        classifier_dropout=None,
        problem_type=None,
        tie_word_embeddings=True,
        # transformers' PretrainedConfig fields the forward reads as its defaults
        output_hidden_states=False,
        output_attentions=False,
        return_dict=True,
    )

    def __init__(self, **kwargs):
        kwargs.pop("model_type", None)
        for k, v in self._defaults.items():
            setattr(self, k, kwargs.pop(k, v))
        id2label = kwargs.pop("id2label", None)
        num_labels = kwargs.pop("num_labels", None)
        kwargs.pop("label2id", None)
        if id2label is not None:
            self.id2label = {int(k): v for k, v in id2label.items()}
        else:
            self.id2label = {i: f"LABEL_{i}" for i in range(2 if num_labels is None else int(num_labels))}
        if num_labels is not None and int(num_labels) != len(self.id2label):
            self.id2label = {i: f"LABEL_{i}" for i in range(int(num_labels))}
        for k, v in kwargs.items():  # anything else transformers wrote (architectures, dtype, ...)
            setattr(self, k, v)
        self.validate()

    @classmethod
    def known_fields(cls):
        """The fields a BertConfig always has (transformers' BertConfig and PretrainedConfig ones), and
        fastbert's dense_seq_output (BertForMaskedLM)."""
        return set(cls._defaults) | {"num_labels", "id2label", "label2id", "dense_seq_output"}

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"fastbert.{type(self).__name__}: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in GELU_FORMS and self.hidden_act not in OTHER_ACTIVATIONS:
            raise ValueError(
                f"fastbert.{type(self).__name__}: hidden_act {self.hidden_act!r} is not supported; "
                f"supported: {sorted(GELU_FORMS) + sorted(OTHER_ACTIVATIONS)}"
            )
        if self.position_embedding_type != "absolute":
            raise ValueError(
                f"fastbert.{type(self).__name__}: position_embedding_type {self.position_embedding_type!r} is not "
                "supported; fastbert implements 'absolute' (what BERT checkpoints use)"
            )

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @num_labels.setter
    def num_labels(self, n: int) -> None:
        self.id2label = {i: f"LABEL_{i}" for i in range(n)}

    @property
    def label2id(self) -> Dict[str, int]:
        return {v: k for k, v in self.id2label.items()}

    @property
    def use_return_dict(self) -> bool:
        return bool(self.return_dict)

    def get_text_config(self, decoder: bool = False, **kwargs) -> "BertConfig":
        """The config of the text model: this one (transformers asks every config for it)."""
        return self

    def to_json_string(self, use_diff: bool = True) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> Dict[str, Any]:
        d = {k: copy.deepcopy(v) for k, v in vars(self).items() if not k.startswith("_")}
        d["id2label"] = {str(k): v for k, v in self.id2label.items()}
        d["label2id"] = self.label2id
        d["model_type"] = self.model_type
        return dict(sorted(d.items()))

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BertConfig":
        return cls(**d)

    @classmethod
    def from_pretrained(cls, path: str) -> "BertConfig":
        """From a config.json, or a directory holding one."""
        file, d = read_config(path, f"fastbert.{cls.__name__}")
        model_type = d.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(
                f"fastbert.{cls.__name__}: {file} describes a {model_type!r} model, not {cls.model_type!r}; "
                "fastbert.AutoModel (and the other Auto classes) pick the class from model_type"
            )
        return cls.from_dict(d)

    def save_pretrained(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")

    def __eq__(self, other) -> bool:
        return isinstance(other, BertConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"{type(self).__name__} {json.dumps(self.to_dict(), indent=2, sort_keys=True)}"


# The other families' configs: BERT's fields under their model_type, with transformers' defaults.

class RobertaConfig(BertConfig):
    model_type = "roberta"
    _defaults = {**BertConfig._defaults, "vocab_size": 50265, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}


class XLMRobertaConfig(RobertaConfig):
    model_type = "xlm-roberta"
    _defaults = {**RobertaConfig._defaults, "vocab_size": 30522}


class CamembertConfig(RobertaConfig):
    model_type = "camembert"
    _defaults = {**RobertaConfig._defaults, "vocab_size": 30522}


class ElectraConfig(BertConfig):
    """ELECTRA: embeddings of embedding_size, projected to hidden_size by a linear layer when the two differ."""

    model_type = "electra"
    _defaults = {**BertConfig._defaults, "embedding_size": 128, "hidden_size": 256, "num_attention_heads": 4,
                 "intermediate_size": 1024, "summary_type": "first", "summary_use_proj": True,
                 "summary_activation": "gelu", "summary_last_dropout": 0.1}


class DistilBertConfig(BertConfig):
    """DistilBERT's own fields (dim, n_layers, n_heads, hidden_dim, activation, dropout, ...), read
    and written under its names; BERT's names (hidden_size, num_attention_heads, ...) read and set
    them, as transformers' attribute_map does. LayerNorm eps is DistilBERT's fixed 1e-12; there
    are no token types."""

    model_type = "distilbert"
    _defaults = dict(vocab_size=30522, max_position_embeddings=512, sinusoidal_pos_embds=False, n_layers=6, n_heads=12,
                     dim=768, hidden_dim=3072, dropout=0.1, attention_dropout=0.1, activation="gelu",
                     initializer_range=0.02, qa_dropout=0.1, seq_classif_dropout=0.2, pad_token_id=0,
                     tie_word_embeddings=True, problem_type=None, output_hidden_states=False, output_attentions=False,
                     return_dict=True)
    ALIASES = {"hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers",
               "intermediate_size": "hidden_dim", "hidden_act": "activation", "hidden_dropout_prob": "dropout",
               "attention_probs_dropout_prob": "attention_dropout"}
    layer_norm_eps = 1e-12
    type_vocab_size = 1
    position_embedding_type = "absolute"
    classifier_dropout = None

    @classmethod
    def known_fields(cls):
        return super().known_fields() | set(cls.ALIASES)


def _alias(name: str) -> property:
    return property(lambda self: getattr(self, name), lambda self, value: setattr(self, name, value))


for _bert_name, _own in DistilBertConfig.ALIASES.items():
    setattr(DistilBertConfig, _bert_name, _alias(_own))


class MPNetConfig(BertConfig):
    """transformers' MPNetConfig: its fields and defaults (mpnet-base's), relative_attention_num_buckets
    among them. No token types; the position ids count from padding id 1 + 1, as RoBERTa's."""

    model_type = "mpnet"
    _defaults = dict(vocab_size=30527, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, max_position_embeddings=512, initializer_range=0.02,
                     layer_norm_eps=1e-12, relative_attention_num_buckets=32, pad_token_id=1, bos_token_id=0,
                     eos_token_id=2, tie_word_embeddings=True, problem_type=None, output_hidden_states=False,
                     output_attentions=False, return_dict=True)
    type_vocab_size = 1  # no token types
    position_embedding_type = "absolute"
    classifier_dropout = None  # the heads drop out at hidden_dropout_prob


class ModernBertConfig(BertConfig):
    """transformers' ModernBertConfig: its fields and defaults (ModernBERT-base's). layer_types (one
    "full_attention" or "sliding_attention" a layer) defaults to a global layer every
    global_attn_every_n_layers (3) layers, the first one global; rope_parameters holds each layer
    type's rope_theta, read from global_rope_theta / local_rope_theta (160000 / 10000) in configs
    written before transformers 5, as transformers reads them. Sliding layers see the keys at most
    local_attention // 2 positions away. No token types, no position table (rotary positions)."""

    model_type = "modernbert"
    LAYER_TYPES = ("full_attention", "sliding_attention")
    _defaults = dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                     num_attention_heads=12, hidden_activation="gelu", max_position_embeddings=8192,
                     initializer_range=0.02, initializer_cutoff_factor=2.0, norm_eps=1e-5, norm_bias=False,
                     pad_token_id=50283, eos_token_id=50282, bos_token_id=50281, cls_token_id=50281,
                     sep_token_id=50282, attention_bias=False, attention_dropout=0.0, layer_types=None,
                     rope_parameters=None, local_attention=128, embedding_dropout=0.0, mlp_bias=False,
                     mlp_dropout=0.0, decoder_bias=True, classifier_pooling="cls", classifier_dropout=0.0,
                     classifier_bias=False, classifier_activation="gelu", deterministic_flash_attn=False,
                     sparse_prediction=False, sparse_pred_ignore_index=-100, tie_word_embeddings=True,
                     problem_type=None, output_hidden_states=False, output_attentions=False, return_dict=True)
    type_vocab_size = 1  # no token types

    def __init__(self, **kwargs):
        every = kwargs.get("global_attn_every_n_layers", 3)  # kept, as transformers keeps it
        thetas = {"full_attention": kwargs.pop("global_rope_theta", 160000.0),
                  "sliding_attention": kwargs.pop("local_rope_theta", 10000.0)}
        scaling = kwargs.pop("rope_scaling", None)
        kwargs.pop("reference_compile", None)  # transformers drops it too
        super().__init__(**kwargs)
        if self.layer_types is None:
            self.layer_types = ["sliding_attention" if i % every else "full_attention"
                                for i in range(self.num_hidden_layers)]
        rope = {t: dict(p) for t, p in (self.rope_parameters or {}).items() if p is not None}
        for layer_type, theta in thetas.items():
            rope.setdefault(layer_type, {"rope_type": "default"})
            rope[layer_type].update(scaling or {})
            rope[layer_type].setdefault("rope_theta", theta)
        self.rope_parameters = rope
        self._built = True
        self.validate()

    def validate(self) -> None:
        if not getattr(self, "_built", False):  # BertConfig.__init__ asks before layer_types and rope are filled in
            return
        where = f"fastbert.{type(self).__name__}"
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{where}: hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        supported = sorted(GELU_FORMS) + sorted(OTHER_ACTIVATIONS)
        for field in ("hidden_activation", "classifier_activation"):
            if getattr(self, field) not in supported:
                raise ValueError(f"{where}: {field} {getattr(self, field)!r} is not supported; supported: {supported}")
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(self.LAYER_TYPES):
            raise ValueError(f"{where}: layer_types must name one of {list(self.LAYER_TYPES)} for each of the "
                             f"{self.num_hidden_layers} layers, got {self.layer_types}")
        for layer_type, params in self.rope_parameters.items():
            if params.get("rope_type", "default") != "default":
                raise ValueError(f"{where}: rope_type {params['rope_type']!r} ({layer_type}) is not supported; "
                                 "fastbert runs the default rotary embedding")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"{where}: classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}")

    @property
    def sliding_window(self) -> int:
        """How far a sliding layer's queries see on either side: local_attention // 2 positions."""
        return self.local_attention // 2

    @sliding_window.setter
    def sliding_window(self, value: int) -> None:
        self.local_attention = 2 * int(value)

    def rope_theta(self, layer_type: str) -> float:
        return float(self.rope_parameters[layer_type]["rope_theta"])


class GteConfig(BertConfig):
    """transformers' GteConfig: its fields and defaults (gte-multilingual-base's). A post-LN encoder
    with rotary positions (rope_parameters' rope_theta, 160000 by default; a rope_theta written at the
    top level, as configs before transformers 5 have it, is read into it) and a gated feed-forward;
    token types where type_vocab_size > 0 (gte-base-en-v1.5 has none). max_position_embeddings is
    the length the model was trained to, not a table (there is none)."""

    model_type = "gte"
    _defaults = dict(vocab_size=250048, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.0, max_position_embeddings=8192, type_vocab_size=1,
                     initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=1, classifier_dropout=None,
                     bos_token_id=None, eos_token_id=None, tie_word_embeddings=True, rope_parameters=None,
                     problem_type=None, output_hidden_states=False, output_attentions=False, return_dict=True)
    position_embedding_type = "absolute"  # (no position table: BertConfig's check of the field holds)
    default_rope_theta = 160000.0

    def __init__(self, **kwargs):
        theta = kwargs.pop("rope_theta", None)
        scaling = kwargs.pop("rope_scaling", None)
        super().__init__(**kwargs)
        rope = dict(self.rope_parameters or {})
        rope.update(scaling or {})
        rope.setdefault("rope_type", rope.pop("type", "default"))
        rope.setdefault("rope_theta", self.default_rope_theta if theta is None else theta)
        self.rope_parameters = rope
        where = f"fastbert.{type(self).__name__}"
        if rope["rope_type"] != "default":
            raise ValueError(f"{where}: rope_type {rope['rope_type']!r} is not supported; fastbert runs the default "
                             "rotary embedding")

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])


class NomicBertConfig(GteConfig):
    """transformers' NomicBertConfig: its fields and defaults (nomic-embed-text-v1.5's): GTE's
    structure without biases, SwiGLU (hidden_act "silu"), two token types, rope_theta 1000. head_dim,
    which transformers keeps, must be hidden_size / num_attention_heads."""

    model_type = "nomic_bert"
    _defaults = dict(vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, hidden_act="silu", hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, max_position_embeddings=2048, type_vocab_size=2,
                     initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0, classifier_dropout=None,
                     bos_token_id=None, eos_token_id=None, tie_word_embeddings=True, rope_parameters=None,
                     problem_type=None, output_hidden_states=False, output_attentions=False, return_dict=True)
    default_rope_theta = 1000.0

    def __init__(self, **kwargs):
        head_dim = kwargs.pop("head_dim", None)
        super().__init__(**kwargs)
        if head_dim is not None and head_dim != self.head_dim:
            raise ValueError(f"fastbert.{type(self).__name__}: head_dim {head_dim} is not hidden_size / "
                             f"num_attention_heads ({self.head_dim}); fastbert runs heads that split the hidden size")

    def to_dict(self):
        return dict(sorted({**super().to_dict(), "head_dim": self.head_dim}.items()))


class JinaEmbeddingsV3Config(GteConfig):
    """transformers' JinaEmbeddingsV3Config: its fields and defaults (jina-embeddings-v3's: XLM-R large's
    shape, 24 layers, hidden 1024, rotary base 20000, one token type, a plain GELU feed-forward).

    Task adapters (fastbert.model.lora) where lora_adaptations names tasks, as the original model's
    config does (with lora_rank, 4, lora_alpha, 1, and task_instructions, each task's prompt);
    transformers' config has none of these fields. The original config's own names are read too:
    position_embedding_type "rotary", rotary_emb_base (the rotary base)."""

    model_type = "jina_embeddings_v3"
    _defaults = dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                     intermediate_size=4096, hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, max_position_embeddings=8194, type_vocab_size=1,
                     initializer_range=0.02, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                     use_cache=True, classifier_dropout=None, tie_word_embeddings=True, rope_parameters=None,
                     problem_type=None, output_hidden_states=False, output_attentions=False, return_dict=True)
    default_rope_theta = 20000.0

    def __init__(self, **kwargs):
        if kwargs.get("position_embedding_type") == "rotary":  # the original config's names
            del kwargs["position_embedding_type"]
        base = kwargs.pop("rotary_emb_base", None)
        if base is not None and kwargs.get("rope_theta") is None and not kwargs.get("rope_parameters"):
            kwargs["rope_theta"] = base
        super().__init__(**kwargs)

    @property
    def tasks(self) -> List[str]:
        """The task adapters' names (lora_adaptations), in their index order; [] where there are none."""
        return list(getattr(self, "lora_adaptations", None) or [])

    def validate(self) -> None:
        super().validate()
        tasks = self.tasks
        if tasks and (len(set(tasks)) != len(tasks) or not all(isinstance(t, str) for t in tasks)):
            raise ValueError(f"fastbert.{type(self).__name__}: lora_adaptations must be distinct task names, "
                             f"got {tasks}")


class EuroBertConfig(BertConfig):
    """transformers' EuroBertConfig: its fields and defaults (EuroBERT-210m's shape, its rope_theta
    10000 unless rope_parameters says otherwise; the published checkpoints' say 250000). A
    Llama-style pre-norm encoder: RMSNorm (rms_norm_eps), rotary positions, a gated feed-forward
    (hidden_act "silu": SwiGLU), grouped-query attention where num_key_value_heads is below
    num_attention_heads (None: as many), head_dim (None: hidden_size / num_attention_heads). No token
    types, no position table."""

    model_type = "eurobert"
    _defaults = dict(vocab_size=128256, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                     num_attention_heads=12, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=8192,
                     initializer_range=0.02, rms_norm_eps=1e-5, use_cache=True, pad_token_id=128001,
                     bos_token_id=128000, eos_token_id=128001, pretraining_tp=1, tie_word_embeddings=False,
                     rope_parameters=None, attention_bias=False, attention_dropout=0.0, mlp_bias=False,
                     mask_token_id=128002, classifier_pooling="late", problem_type=None, output_hidden_states=False,
                     output_attentions=False, return_dict=True)
    type_vocab_size = 1  # no token types
    position_embedding_type = "absolute"  # (no position table: BertConfig's check of the field holds)
    POOLINGS = ("bos", "mean", "late")

    def __init__(self, **kwargs):
        head_dim = kwargs.pop("head_dim", None)
        theta = kwargs.pop("rope_theta", None)
        scaling = kwargs.pop("rope_scaling", None)
        super().__init__(**kwargs)
        self._head_dim = head_dim
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        rope = dict(self.rope_parameters or {})
        rope.update(scaling or {})
        rope.setdefault("rope_type", rope.pop("type", "default"))
        rope.setdefault("rope_theta", 10000.0 if theta is None else theta)
        self.rope_parameters = rope
        self._built = True
        self.validate()

    def validate(self) -> None:
        if not getattr(self, "_built", False):  # BertConfig.__init__ asks before head_dim and rope are filled in
            return
        where = f"fastbert.{type(self).__name__}"
        super().validate()
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{where}: num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.rope_parameters["rope_type"] != "default":
            raise ValueError(f"{where}: rope_type {self.rope_parameters['rope_type']!r} is not supported; fastbert "
                             "runs the default rotary embedding")
        if self.classifier_pooling not in self.POOLINGS:
            raise ValueError(f"{where}: classifier_pooling must be one of {list(self.POOLINGS)}, got "
                             f"{self.classifier_pooling!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads if self._head_dim is None else int(self._head_dim)

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])

    def to_dict(self):
        return dict(sorted({**super().to_dict(), "head_dim": self.head_dim}.items()))


class DebertaV2Config(BertConfig):
    """transformers' DebertaV2Config: its fields and defaults (deberta-v2-xlarge's widths), and the
    fields its checkpoints add that transformers reads with getattr: position_buckets (-1: none),
    share_att_key (False), norm_rel_ebd ("none"), embedding_size (hidden_size), conv_kernel_size (0),
    pooler_hidden_size (hidden_size), cls_dropout (None: hidden_dropout_prob). pos_att_type: a list
    or "p2c|c2p" as the files write it. deberta-v3 (base, large, mdeberta-v3-base): relative
    attention over 256 log buckets, c2p and p2c with shared projections, no absolute positions, no
    token types."""

    model_type = "deberta-v2"
    _defaults = dict(vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24,
                     intermediate_size=6144, hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=0,
                     initializer_range=0.02, layer_norm_eps=1e-7, relative_attention=False, max_relative_positions=-1,
                     pad_token_id=0, bos_token_id=None, eos_token_id=None, position_biased_input=True,
                     pos_att_type=None, pooler_dropout=0.0, pooler_hidden_act="gelu", legacy=True,
                     tie_word_embeddings=True, problem_type=None, output_hidden_states=False,
                     output_attentions=False, return_dict=True)
    position_embedding_type = "absolute"  # (no such field: BertConfig's check of it holds)
    POSITION_TERMS = ("c2p", "p2c")

    def __init__(self, **kwargs):
        terms = kwargs.get("pos_att_type")
        if isinstance(terms, str):
            kwargs["pos_att_type"] = [x.strip() for x in terms.lower().split("|")]
        super().__init__(**kwargs)

    def validate(self) -> None:
        super().validate()
        where = f"fastbert.{type(self).__name__}"
        unknown = [t for t in (self.pos_att_type or []) if t not in self.POSITION_TERMS]
        if unknown:
            raise ValueError(f"{where}: pos_att_type {unknown} is not supported; supported: c2p, p2c")
        if getattr(self, "conv_kernel_size", 0) > 0:
            raise ValueError(f"{where}: conv_kernel_size {self.conv_kernel_size} (deberta-v2-xlarge's convolution "
                             "after the first layer) is not supported; deberta-v3 and mdeberta-v3 have none")

    @property
    def position_terms(self) -> List[str]:
        """The position terms the attention adds (c2p, p2c), where relative_attention is on."""
        return [t for t in self.POSITION_TERMS if t in (self.pos_att_type or [])] if self.relative_attention else []

    @property
    def score_scale_terms(self) -> int:
        """What the attention scores are scaled by the square root of, times head_dim: 1 plus the
        position terms pos_att_type names (transformers counts them even where relative_attention
        is off)."""
        return 1 + sum(t in (self.pos_att_type or []) for t in self.POSITION_TERMS)

    @property
    def relative_span(self) -> int:
        """Half the rows of the relative embeddings: position_buckets where positive, else
        max_relative_positions (max_position_embeddings where that is below 1)."""
        buckets = getattr(self, "position_buckets", -1)
        return buckets if buckets > 0 else self.max_relative_distance

    @property
    def max_relative_distance(self) -> int:
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings
