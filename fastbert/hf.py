"""Interop with transformers: fastbert attention inside transformers' BERT, and model conversion.

    fastbert.hf.register()
        makes attn_implementation="fastbert" a valid choice for transformers' BERT models:
        BertModel.from_pretrained(path, attn_implementation="fastbert") then runs its attention
        through fastbert.ops.attention (registered with both AttentionInterface and
        AttentionMaskInterface: the mask handed to the attention is the [batch, seq] padding mask).
    fastbert.hf.from_transformers(model, backend=None)
        a loaded transformers BERT model (BertModel or one of the heads fastbert has) as the
        fastbert class, sharing its parameters (no copy: training one trains the other).

    transformers.Trainer.save_model on a fastbert model
        writes what save_pretrained writes (config.json and the weights, which transformers loads),
        not the bare state dict Trainer saves for models that are not transformers' own: fastbert
        models patch Trainer's saving once transformers' trainer module is loaded.

transformers is imported only when these functions are called.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import torch

import fastbert
from fastbert import ops

ATTN_IMPLEMENTATION = "fastbert"
_CLASSES = (
    "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering",
)


def fastbert_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: query/key/value [batch, heads, seq, head_dim],
    attention_mask [batch, seq] bool (from fastbert_attention_mask) or None.
    Returns (output [batch, seq, heads, head_dim], the probabilities [batch, heads, seq, seq] when
    output_attentions asked for them, else None)."""
    if is_causal or getattr(module, "is_causal", False):
        raise NotImplementedError("fastbert attention is bidirectional (encoder) attention; causal masks are not supported")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"fastbert attention expects the [batch, seq] padding mask that fastbert_attention_mask builds, got a "
            f"mask of shape {tuple(attention_mask.shape)}"
        )
    if key.shape[2] != query.shape[2]:
        raise NotImplementedError("fastbert attention needs as many keys as queries (self-attention)")
    if kwargs.get("output_attentions"):  # the probabilities were asked for: the explicit path, which forms them
        bias = None
        if attention_mask is not None:
            bias = torch.zeros(attention_mask.shape, dtype=torch.float32, device=attention_mask.device)
            bias = bias.masked_fill(~attention_mask, float("-inf"))[:, None, None, :]
        out, probs = ops.attention_weights(query, key, value, bias, dropout_p=float(dropout), scale=scaling)
        return out.transpose(1, 2).contiguous(), probs
    out = ops.attention(query, key, value, attention_mask, dropout_p=float(dropout), scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def fastbert_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                            attention_mask=None, **kwargs):
    """transformers' mask-function signature: the 2-D padding mask as bool, or None without padding."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:].to(torch.bool)
    if attention_mask.all():
        return None
    return attention_mask


def register() -> None:
    """Make attn_implementation="fastbert" available to transformers' models (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, fastbert_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, fastbert_attention_mask)


def from_transformers(model, backend: Optional[str] = None):
    """The fastbert model for a loaded transformers BERT model, sharing its parameters."""
    name = type(model).__name__
    if name not in _CLASSES:
        raise TypeError(f"fastbert.hf.from_transformers: {name} is not supported; supported: {', '.join(_CLASSES)}")
    if getattr(model.config, "model_type", None) != "bert":
        raise TypeError(f"fastbert.hf.from_transformers: the model's config is {model.config.model_type!r}, not 'bert'")
    config = fastbert.BertConfig(**model.config.to_dict())
    cls = getattr(fastbert, name)
    kwargs = {}
    if name == "BertModel":
        kwargs["add_pooling_layer"] = model.pooler is not None
    with torch.device("meta"):
        fm = cls(config, **kwargs)
    for pname, _ in list(fm.named_parameters(remove_duplicate=False)):
        owner, attr = _owner(fm, pname)
        try:
            param = model.get_parameter(pname)
        except AttributeError:
            raise ValueError(f"fastbert.hf.from_transformers: the {name} has no parameter {pname}") from None
        setattr(owner, attr, param)
    if hasattr(fm, "tie_weights"):
        fm.tie_weights()
    left = [n for n, p in fm.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"fastbert.hf.from_transformers: parameters not found in the {name}: {left}")
    fm.train(model.training)
    return fm.set_backend(backend)


def _owner(module, dotted: str):
    *path, attr = dotted.split(".")
    for p in path:
        module = getattr(module, p)
    return module, attr


def patch_trainer_if_loaded() -> None:
    """Make transformers.Trainer save fastbert models with their save_pretrained, when transformers'
    trainer module is loaded (cheap otherwise: a dictionary lookup)."""
    trainer_module = sys.modules.get("transformers.trainer")
    if trainer_module is None or getattr(trainer_module.Trainer._save, "_fastbert", False):
        return
    original = trainer_module.Trainer._save

    def _save(self, output_dir=None, state_dict=None):
        model = self.model
        while hasattr(model, "module") and not isinstance(model, fastbert.model.BertPreTrainedModel):
            model = model.module  # DistributedDataParallel and other wrappers
        if not isinstance(model, fastbert.model.BertPreTrainedModel):
            return original(self, output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return None
        os.makedirs(output_dir, exist_ok=True)
        model.save_pretrained(output_dir, state_dict=state_dict,
                              safe_serialization=getattr(self.args, "save_safetensors", True))
        processing = self.processing_class or getattr(self.data_collator, "tokenizer", None)
        if processing is not None:
            processing.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
        return None

    _save._fastbert = True
    trainer_module.Trainer._save = _save
