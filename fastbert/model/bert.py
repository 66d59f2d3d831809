"""BERT on fastbert's fused ops, a drop-in for transformers' BERT classes.

Same config fields, same module and parameter names (so state dicts move both ways unchanged),
same forward arguments and output field names. Inside, every layer runs through fastbert.ops:

    embeddings (+ LayerNorm) -> unpad once -> N x [QKV GEMM -> attention -> out GEMM ->
    add_layer_norm -> GEMM -> bias_gelu -> GEMM -> add_layer_norm] -> pad once -> heads

A batch with padding runs packed (varlen attention over the real tokens only); a batch without
padding, or any batch under torch.compile, runs padded. Both give the same values at real tokens;
hidden states at padded positions are not defined (fastbert leaves them zero on the packed path).
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME = "pytorch_model.bin"

# hidden_act -> the GELU form of fastbert.ops.bias_gelu ("none": exact erf, "tanh": approximation)
_GELU_FORMS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}
_OTHER_ACTS = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh}


# --------------------------------------------------------------------------------------------
# config


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
        self._validate()

    def _validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"fastbert.BertConfig: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in _GELU_FORMS and self.hidden_act not in _OTHER_ACTS:
            raise ValueError(
                f"fastbert.BertConfig: hidden_act {self.hidden_act!r} is not supported; "
                f"supported: {sorted(_GELU_FORMS) + sorted(_OTHER_ACTS)}"
            )
        if self.position_embedding_type != "absolute":
            raise ValueError(
                f"fastbert.BertConfig: position_embedding_type {self.position_embedding_type!r} is not "
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
        file = os.path.join(path, CONFIG_NAME) if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise FileNotFoundError(f"fastbert.BertConfig: no {CONFIG_NAME} at {path}")
        try:
            with open(file, encoding="utf-8") as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"fastbert.BertConfig: {file} is not valid JSON ({e})") from None
        model_type = d.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(
                f"fastbert.BertConfig: {file} describes a {model_type!r} model; fastbert loads BERT (model_type 'bert')"
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
        return f"BertConfig {json.dumps(self.to_dict(), indent=2, sort_keys=True)}"


# --------------------------------------------------------------------------------------------
# outputs: attribute access and tuple-style indexing, as transformers' ModelOutput


class _Output:
    def to_tuple(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None)

    def __getitem__(self, key):
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self):
        return iter(self.to_tuple())

    def keys(self):
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


@dataclass
class BaseModelOutputWithPooling(_Output):
    last_hidden_state: Optional[torch.Tensor] = None
    pooler_output: Optional[torch.Tensor] = None


@dataclass
class BertForPreTrainingOutput(_Output):
    loss: Optional[torch.Tensor] = None
    prediction_logits: Optional[torch.Tensor] = None
    seq_relationship_logits: Optional[torch.Tensor] = None


@dataclass
class MaskedLMOutput(_Output):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


@dataclass
class SequenceClassifierOutput(_Output):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


@dataclass
class TokenClassifierOutput(_Output):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


@dataclass
class QuestionAnsweringModelOutput(_Output):
    loss: Optional[torch.Tensor] = None
    start_logits: Optional[torch.Tensor] = None
    end_logits: Optional[torch.Tensor] = None


# --------------------------------------------------------------------------------------------
# layers (module and parameter names are transformers')


class _Backend:
    """Mixin: the fastbert.ops backend a module's ops run on (None: automatic), set model-wide."""

    backend: Optional[str] = None


class BertEmbeddings(nn.Module, _Backend):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, position_ids):
        words = self.word_embeddings(input_ids)
        rest = self.token_type_embeddings(token_type_ids) + self.position_embeddings(position_ids)
        h = ops.add_layer_norm(
            words, rest.to(words.dtype), self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps,
            backend=self.backend,
        )
        return self.dropout(h)


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.head_dim
        self.all_head_size = config.hidden_size
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self._packed = None  # (key, weight, bias): the QKV weights concatenated, for inference

    def qkv_weight(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The three projections as one [3 * hidden, hidden] GEMM. Under autograd the concatenation
        is part of the graph; for inference it is kept until a weight changes."""
        params = (self.query.weight, self.key.weight, self.value.weight, self.query.bias, self.key.bias, self.value.bias)
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return torch.cat(params[:3]), torch.cat(params[3:])
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, torch.cat(params[:3]).detach(), torch.cat(params[3:]).detach())
        return self._packed[1], self._packed[2]


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.hidden_act = config.hidden_act


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)



def _dropout_p(module: nn.Module, p: float) -> float:
    return p if module.training else 0.0


def _activation(x: torch.Tensor, bias: torch.Tensor, act: str, backend) -> torch.Tensor:
    if act in _GELU_FORMS:
        return ops.bias_gelu(x, bias, _GELU_FORMS[act], backend=backend)
    return _OTHER_ACTS[act](x + bias)


class BertLayer(nn.Module, _Backend):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden: torch.Tensor, mask: Optional[torch.Tensor], packed: Optional[Tuple[torch.Tensor, int]]):
        """hidden: [batch, seq, hidden] (padded path, mask [batch, seq] or None) or
        [tokens, hidden] (packed path, packed = (cu_seqlens, max_seqlen))."""
        sa, so = self.attention.self, self.attention.output
        heads, d = sa.num_attention_heads, sa.attention_head_size
        w, b = sa.qkv_weight()
        qkv = ops.linear(hidden, w, b)
        p_attn = _dropout_p(self, sa.dropout_p)
        if packed is not None:
            q, k, v = qkv.view(-1, 3, heads, d).unbind(1)  # [tokens, heads, d] each
            ctx = ops.varlen_attention(q, k, v, packed[0], packed[1], dropout_p=p_attn, backend=self.backend)
            ctx = ctx.reshape(-1, heads * d)
        else:
            bsz, seq = hidden.shape[:2]
            q, k, v = qkv.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # [batch, heads, seq, d]
            ctx = ops.attention(q, k, v, mask, dropout_p=p_attn, backend=self.backend)
            ctx = ctx.transpose(1, 2).reshape(bsz, seq, heads * d)
        attn = ops.linear(ctx, so.dense.weight, so.dense.bias)
        h1 = ops.add_layer_norm(
            attn, hidden, so.LayerNorm.weight, so.LayerNorm.bias, so.LayerNorm.eps,
            dropout_p=_dropout_p(self, so.dropout.p), backend=self.backend,
        )
        inter = ops.linear(h1, self.intermediate.dense.weight)
        inter = _activation(inter, self.intermediate.dense.bias, self.intermediate.hidden_act, self.backend)
        out = ops.linear(inter, self.output.dense.weight, self.output.dense.bias)
        return ops.add_layer_norm(
            out, h1, self.output.LayerNorm.weight, self.output.LayerNorm.bias, self.output.LayerNorm.eps,
            dropout_p=_dropout_p(self, self.output.dropout.p), backend=self.backend,
        )


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden[:, 0]))


class BertPredictionHeadTransform(nn.Module, _Backend):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.hidden_act = config.hidden_act
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = _activation(ops.linear(hidden, self.dense.weight), self.dense.bias, self.hidden_act, self.backend)
        return F.layer_norm(h, h.shape[-1:], self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps)


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias  # one parameter under both names, as in transformers

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, sequence_output):
        return self.predictions(sequence_output)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


# --------------------------------------------------------------------------------------------
# the pretrained-model machinery: init, backend, loading and saving


class BertPreTrainedModel(nn.Module):
    """Weights init as transformers', from_pretrained / save_pretrained in transformers' format."""

    base_model_prefix = "bert"
    # keys that share a tensor with another key: not written by save_pretrained, tied on load
    _tied_weights_keys: Dict[str, str] = {}

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"fastbert: config must be a fastbert.BertConfig, got {type(config).__name__}")
        self.config = config
        self._backend: Optional[str] = None

    def post_init(self) -> None:
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead):
            nn.init.zeros_(module.bias)

    @property
    def backend(self) -> Optional[str]:
        return self._backend

    def set_backend(self, backend: Optional[str]) -> "BertPreTrainedModel":
        """Run every fused op of this model on `backend` ("triton", "cpp", "torch"; None: automatic)."""
        from fastbert.backend import BACKENDS

        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"fastbert: unknown backend {backend!r}; choose one of {BACKENDS} or None")
        self._backend = backend
        for m in self.modules():
            if isinstance(m, _Backend):
                m.backend = backend
        return self

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def get_input_embeddings(self) -> nn.Embedding:
        return self.base_model().embeddings.word_embeddings

    def base_model(self) -> "BertModel":
        return getattr(self, self.base_model_prefix, self)

    # ---- saving

    def save_pretrained(self, directory: str) -> None:
        """config.json + model.safetensors, as transformers writes them (tied copies left out)."""
        from safetensors.torch import save_file

        os.makedirs(directory, exist_ok=True)
        config = self.config.to_dict()
        config["architectures"] = [type(self).__name__]
        config["dtype"] = str(self.dtype).replace("torch.", "")
        config.pop("torch_dtype", None)
        BertConfig(**config).save_pretrained(directory)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if k not in self._tied_weights_keys}
        tmp = os.path.join(directory, SAFE_WEIGHTS_NAME + ".tmp")
        save_file(state, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(directory, SAFE_WEIGHTS_NAME))  # never a half-written checkpoint

    # ---- loading

    @classmethod
    def from_pretrained(cls, path: str, backend: Optional[str] = None, dtype: Optional[torch.dtype] = None, **config_overrides):
        """Load a transformers-format directory: config.json + model.safetensors or pytorch_model.bin.

        Old checkpoints (LayerNorm gamma/beta, position_ids buffers, with or without the "bert."
        prefix) load too. Missing or unexpected keys are reported in a warning that names them.
        """
        if not os.path.isdir(path):
            raise FileNotFoundError(f"fastbert: {path} is not a directory (expected config.json and model weights)")
        config = BertConfig.from_pretrained(path)
        for k, v in config_overrides.items():
            setattr(config, k, v)
        state = load_state_dict(path)
        model = cls(config)
        model.load_transformers_state_dict(state, source=path)
        if dtype is not None:
            model = model.to(dtype)
        model.set_backend(backend)
        return model.eval()

    def load_transformers_state_dict(self, state: Dict[str, torch.Tensor], source: str = "state dict") -> None:
        """load_state_dict for checkpoints of any BERT class, old or new names; warns with the keys
        that were missing or left over."""
        import warnings

        state = _normalise_keys(state)
        own = self.state_dict()
        prefix = self.base_model_prefix + "."
        has_prefix = any(k.startswith(prefix) for k in own)
        renamed = {}
        for k, v in state.items():
            if has_prefix and not k.startswith(prefix) and prefix + k in own:
                k = prefix + k  # a BertModel checkpoint into a model with heads
            elif not has_prefix and k.startswith(prefix):
                k = k[len(prefix):]  # a checkpoint with heads into a BertModel
            renamed[k] = v
        for dst, src in self._tied_weights_keys.items():
            if dst not in renamed and src in renamed:
                renamed[dst] = renamed[src]
        missing = sorted(k for k in own if k not in renamed)
        unexpected = sorted(k for k in renamed if k not in own)
        bad_shapes = [f"{k}: checkpoint {tuple(renamed[k].shape)} vs model {tuple(own[k].shape)}"
                      for k in own if k in renamed and renamed[k].shape != own[k].shape]
        if bad_shapes:
            raise ValueError(f"fastbert: {source} does not fit this config: " + "; ".join(bad_shapes))
        self.load_state_dict({k: v for k, v in renamed.items() if k in own}, strict=False)
        if missing or unexpected:
            msg = f"fastbert: loading {type(self).__name__} from {source}:"
            if missing:
                msg += f"\n  missing (left at their initial values): {missing}"
            if unexpected:
                msg += f"\n  unexpected (ignored): {unexpected}"
            warnings.warn(msg, stacklevel=3)


def _normalise_keys(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.endswith("position_ids") or k.endswith("embeddings.token_type_ids"):
            continue  # buffers older checkpoints saved
        if "LayerNorm" in k or "layer_norm" in k:
            k = k.replace(".gamma", ".weight").replace(".beta", ".bias")
        out[k] = v
    return out


def load_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of model.safetensors (preferred) or pytorch_model.bin in `path`, with clear errors."""
    safe = os.path.join(path, SAFE_WEIGHTS_NAME)
    pt = os.path.join(path, WEIGHTS_NAME)
    if os.path.isfile(safe):
        from safetensors.torch import load_file

        try:
            return load_file(safe)
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise ValueError(f"fastbert: {safe} could not be read; the file is damaged or not safetensors ({e})") from None
    if os.path.isfile(pt):
        try:
            return torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"fastbert: {pt} could not be read ({e})") from None
    raise FileNotFoundError(f"fastbert: {path} has no {SAFE_WEIGHTS_NAME} or {WEIGHTS_NAME}")


# --------------------------------------------------------------------------------------------
# the model


def _check_ids(name: str, t: Optional[torch.Tensor], shape, upper: int, what: str) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fastbert: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() or t.dtype == torch.bool:
        raise TypeError(f"fastbert: {name} must hold integer ids, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"fastbert: {name} has shape {tuple(t.shape)}; it must be {tuple(shape)} like input_ids")
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= upper:
            raise ValueError(f"fastbert: {name} must be in [0, {upper}) ({what}), got values in [{lo}, {hi}]")


def _check_mask(mask, shape) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"fastbert: attention_mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"fastbert: attention_mask has shape {tuple(mask.shape)}; it must be {tuple(shape)} like input_ids")
    if mask.numel() and not ((mask == 0) | (mask == 1)).all():
        raise ValueError("fastbert: attention_mask must be in {0, 1} (0 = padding, 1 = real token)")


class BertModel(BertPreTrainedModel):
    # a batch with padding runs packed (unpad once, varlen attention, pad once); False keeps every
    # batch padded (the two paths agree at real tokens; the switch is there to check that)
    unpad_inputs: bool = True

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def base_model(self) -> "BertModel":
        return self

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, return_dict=True):
        """input_ids [batch, seq]; attention_mask [batch, seq] (1 = real token); token_type_ids,
        position_ids [batch, seq] -> .last_hidden_state [batch, seq, hidden], .pooler_output [batch, hidden]."""
        cfg = self.config
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(
                f"fastbert: input_ids must be a [batch, seq] tensor, got "
                f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__}"
            )
        bsz, seq = input_ids.shape
        if seq > cfg.max_position_embeddings:
            raise ValueError(f"fastbert: sequence length {seq} is longer than max_position_embeddings {cfg.max_position_embeddings}")
        compiling = torch.compiler.is_compiling()
        if not compiling:  # value checks read the tensors: skipped while torch.compile traces
            _check_ids("input_ids", input_ids, None, cfg.vocab_size, "the vocabulary")
            _check_ids("token_type_ids", token_type_ids, input_ids.shape, cfg.type_vocab_size, "type_vocab_size")
            _check_ids("position_ids", position_ids, None, cfg.max_position_embeddings, "max_position_embeddings")
            if attention_mask is not None:
                _check_mask(attention_mask, input_ids.shape)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(seq, device=input_ids.device).expand(bsz, seq)
        hidden = self.embeddings(input_ids, token_type_ids, position_ids)
        mask = None if attention_mask is None else attention_mask.to(torch.bool)
        packed = self.unpad_inputs and mask is not None and not compiling and not bool(mask.all())
        if packed:
            h, indices, cu_seqlens, max_seqlen = ops.unpad(hidden, mask)
            for layer in self.encoder.layer:
                h = layer(h, None, (cu_seqlens, max_seqlen))
            hidden = ops.pad(h, indices, bsz, seq)
        else:
            for layer in self.encoder.layer:
                hidden = layer(hidden, mask, None)
        pooled = self.pooler(hidden) if self.pooler is not None else None
        out = BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled)
        return out if return_dict else out.to_tuple()


def _real_token_head(head: nn.Module, hidden: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """head(hidden) [batch, seq, ...], computed at real tokens only when the batch has padding
    (zeros at padded positions). The MLM head's vocabulary GEMM on padded rows is wasted work, and
    its LayerNorm turns the all-zero padded rows of last_hidden_state (with a zero dense bias, as
    initialised) into a rstd of 1/sqrt(eps), whose fp16 backward gives NaN gradients even though
    those rows take no loss."""
    if attention_mask is None or torch.compiler.is_compiling():
        return head(hidden)
    if bool(attention_mask.to(torch.bool).all()):
        return head(hidden)
    rows, indices, _, _ = ops.unpad(hidden, attention_mask)
    return ops.pad(head(rows), indices, *attention_mask.shape)


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


class BertForPreTraining(BertPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.post_init()
        self.tie_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                next_sentence_label=None, return_dict=True):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        scores = _real_token_head(self.cls.predictions, out.last_hidden_state, attention_mask)
        nsp = self.cls.seq_relationship(out.pooler_output)
        loss = None
        if labels is not None and next_sentence_label is not None:
            loss = _ce(scores, labels) + _ce(nsp, next_sentence_label)
        res = BertForPreTrainingOutput(loss=loss, prediction_logits=scores, seq_relationship_logits=nsp)
        return res if return_dict else res.to_tuple()


class BertForMaskedLM(BertPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()
        self.tie_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None, return_dict=True):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        scores = _real_token_head(self.cls.predictions, out.last_hidden_state, attention_mask)
        loss = _ce(scores, labels) if labels is not None else None
        res = MaskedLMOutput(loss=loss, logits=scores)
        return res if return_dict else res.to_tuple()


class BertForSequenceClassification(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None, return_dict=True):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        logits = self.classifier(self.dropout(out.pooler_output))
        loss = None
        if labels is not None:
            problem = self.config.problem_type
            if problem is None:
                if self.num_labels == 1:
                    problem = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    problem = "single_label_classification"
                else:
                    problem = "multi_label_classification"
                self.config.problem_type = problem
            if problem == "regression":
                loss = F.mse_loss(logits.squeeze(), labels.squeeze()) if self.num_labels == 1 else F.mse_loss(logits, labels)
            elif problem == "single_label_classification":
                loss = _ce(logits, labels)
            else:
                loss = F.binary_cross_entropy_with_logits(logits, labels)
        res = SequenceClassifierOutput(loss=loss, logits=logits)
        return res if return_dict else res.to_tuple()


class BertForTokenClassification(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None, return_dict=True):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        logits = self.classifier(self.dropout(out.last_hidden_state))
        loss = _ce(logits, labels) if labels is not None else None
        res = TokenClassifierOutput(loss=loss, logits=logits)
        return res if return_dict else res.to_tuple()


class BertForQuestionAnswering(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, start_positions=None,
                end_positions=None, return_dict=True):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        logits = self.qa_outputs(out.last_hidden_state)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            start_positions = start_positions.reshape(-1)
            end_positions = end_positions.reshape(-1)
            ignored = start_logits.size(1)  # positions outside the input are ignored, as in transformers
            start_positions = start_positions.clamp(0, ignored)
            end_positions = end_positions.clamp(0, ignored)
            loss = (F.cross_entropy(start_logits.float(), start_positions, ignore_index=ignored)
                    + F.cross_entropy(end_logits.float(), end_positions, ignore_index=ignored)) / 2
        res = QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)
        return res if return_dict else res.to_tuple()


__all__ = [
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "BertPreTrainedModel",
]
