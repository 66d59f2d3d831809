"""Interop with transformers: fastbert attention inside transformers' BERT, and model conversion.

    fastbert.hf.register()
        makes attn_implementation="fastbert" a valid choice for transformers' BERT models:
        BertModel.from_pretrained(path, attn_implementation="fastbert") then runs its attention
        through fastbert.ops.attention (registered with both AttentionInterface and
        AttentionMaskInterface: the mask handed to the attention is the [batch, seq] padding mask).
    fastbert.hf.from_transformers(model, backend=None)
        a loaded transformers model of a family fastbert runs (BERT, RoBERTa, XLM-RoBERTa,
        CamemBERT, ELECTRA: the base model or a head fastbert has) as the fastbert class of the
        same name, sharing its parameters (no copy: training one trains the other).
    fastbert.patch(model) / fastbert.patch_transformers()
        the model itself runs on fastbert from then on: its forward is the fastbert model's,
        whose parameters are the model's own Parameter objects (an optimizer built before the
        patch still trains it; nothing is copied, so nothing can fall behind); patch_transformers
        makes transformers' from_pretrained patch every model of a supported class it loads.

    transformers.Trainer.save_model on a fastbert model
        writes what save_pretrained writes (config.json and the weights, which transformers loads),
        not the bare state dict Trainer saves for models that are not transformers' own: fastbert
        models patch Trainer's saving once transformers' trainer module is loaded
        (fastbert.model.trainer_save).

transformers is imported only when these functions are called.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from fastbert import ops

ATTN_IMPLEMENTATION = "fastbert"


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


def _fastbert_class(model, where: str):
    """The fastbert class for a transformers model (same class name and model_type), or a TypeError."""
    from fastbert.model.auto import FAMILIES, PRETRAINING

    name = type(model).__name__
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    classes = {c.__name__: c for family in FAMILIES.values() for c in family.values()}
    classes.update({c.__name__: c for c in PRETRAINING.values()})
    if name not in classes:
        raise TypeError(f"{where}: {name} is not supported; supported: {', '.join(sorted(classes))}")
    cls = classes[name]
    if model_type != cls.config_class.model_type:
        raise TypeError(f"{where}: the model's config is {model_type!r}, not {cls.config_class.model_type!r}")
    return cls


def from_transformers(model, backend: Optional[str] = None):
    """The fastbert model for a loaded transformers model, sharing its parameters."""
    from fastbert.model.bert import BertModel

    cls = _fastbert_class(model, "fastbert.hf.from_transformers")
    name = cls.__name__
    config = cls.config_class(**model.config.to_dict())
    kwargs = {}
    if issubclass(cls, BertModel) and hasattr(model, "pooler"):  # a base model, with or without its pooler
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


def patch(model, backend: Optional[str] = None):
    """Run a model loaded by transformers (a class fastbert has: fastbert.hf.from_transformers) on
    fastbert, in place: model(...) and model.forward(...) run the fastbert model that shares its
    Parameter objects, in the model's train / eval mode, and return the same fields. The model's
    modules, state_dict and parameters stay what they were; model.fastbert_model is the fastbert
    model it runs. Returns the model (patching twice is the same as once)."""
    if getattr(model, "fastbert_model", None) is not None:
        return model
    fm = from_transformers(model, backend)

    @functools.wraps(fm.forward)
    def forward(*args, **kwargs):
        if fm.training != model.training:
            fm.train(model.training)
        return fm(*args, **kwargs)

    object.__setattr__(model, "fastbert_model", fm)  # not a submodule: no second copy in state_dict()
    model.forward = forward
    return model


def patch_transformers() -> None:
    """From now on, transformers' from_pretrained (every class and the Auto classes) returns the
    models fastbert runs patched (fastbert.patch); other models load as before. Idempotent."""
    import transformers

    base = transformers.PreTrainedModel
    if getattr(base.from_pretrained, "_fastbert", False):
        return
    original = base.from_pretrained.__func__

    @functools.wraps(original)
    def from_pretrained(cls, *args, **kwargs):
        out = original(cls, *args, **kwargs)
        model = out[0] if isinstance(out, tuple) else out
        try:
            _fastbert_class(model, "")
        except TypeError:
            return out  # a class or model_type fastbert does not run
        patch(model)
        return out

    from_pretrained._fastbert = True
    from_pretrained._original = original
    base.from_pretrained = classmethod(from_pretrained)


def unpatch_transformers() -> None:
    """Undo patch_transformers (models patched already stay patched)."""
    import transformers

    base = transformers.PreTrainedModel
    if getattr(base.from_pretrained, "_fastbert", False):
        base.from_pretrained = classmethod(base.from_pretrained._original)


def _owner(module, dotted: str):
    *path, attr = dotted.split(".")
    for p in path:
        module = getattr(module, p)
    return module, attr
