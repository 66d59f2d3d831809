"""Jina embeddings v3 (jina-embeddings-v3): XLM-RoBERTa with rotary positions, on GTE's layer (gte.py:
BertLayer's code, the rotation inside the attention kernel) with a plain feed-forward, and RoBERTa's
heads.

What differs from GTE, and is all that is written here:
- the feed-forward is BERT's: fc1, GELU (fused with its bias), fc2, with no dropout of its own;
- the weights live under "roberta."; the heads are RoBERTa's (lm_head with its tied bias, the
  first-token classifier, token classification, question answering) on this encoder;
- the files keep the original model's names (the QKV joined as mixer.Wqkv, mixer.out_proj, norm1 /
  norm2, emb_ln, the layers under encoder.layers), which transformers reads and writes;
- the task adapters (config.lora_adaptations; fastbert.model.lora), which transformers' class lacks:
  one per task on the word and token type embeddings, each layer's Wqkv, out_proj, fc1 and fc2, and
  the pooler, in the original model's files as those weights' parametrizations (lora_A, lora_B; the
  weight itself as parametrizations.weight.original, which is read; fastbert writes it as the plain
  weight, so transformers loads the encoder without the adapters). A forward takes task= (a name, or
  one per row) or adapter_mask= (task indices per row, transformers' and the original model's
  argument); without either, no adapter (the original model's rule). from_pretrained(..., task=) and
  fold_task fold one task into the weights for good (the inference routes, int8, CUDA graphs).
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import nn

from fastbert import ops
from fastbert.model.checkpoint import KeyFormat
from fastbert.model.config import JinaEmbeddingsV3Config
from fastbert.model.gte import GteEmbeddings, GteLayer, GteModel
from fastbert.model.layers import BertPooler
from fastbert.model.lora import TaskLoRA, selecting, selection, task_rows
from fastbert.model.roberta import (
    RobertaForMaskedLM,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
)
from fastbert.ops.common import DropoutSeeds

ADAPTER = "parametrizations.weight.0."  # where the original files keep a weight's adapters
CHECKPOINT_FORMAT = KeyFormat(
    renames=(("mixer.Wqkv." + ADAPTER, "lora.qkv."), ("mixer.out_proj." + ADAPTER, "lora.attention_output."),
             ("mlp.fc1." + ADAPTER, "lora.ffn_input."), ("mlp.fc2." + ADAPTER, "lora.ffn_output."),
             ("word_embeddings." + ADAPTER, "lora.word_embeddings."),
             ("token_type_embeddings." + ADAPTER, "lora.token_type_embeddings."),
             ("pooler.dense." + ADAPTER, "pooler.lora."),
             ("encoder.layers.", "layers."), ("emb_ln.", "embeddings.LayerNorm."),
             ("mixer.out_proj.", "self_attn.o_proj."), ("norm1.", "post_attention_layernorm."),
             ("norm2.", "post_mlp_layernorm.")),
    joins=(("mixer.Wqkv.", ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")),),
    read_renames=(("parametrizations.weight.original", "weight"),))

# the roles of a layer's adapted linear layers (BertLayer's), in the files as Wqkv, out_proj, fc1, fc2
LAYER_ROLES = ("qkv", "attention_output", "ffn_input", "ffn_output")


def _adapters(config: JinaEmbeddingsV3Config, fan_in: int, fan_out: int, kind: str = "linear") -> TaskLoRA:
    return TaskLoRA(len(config.tasks), getattr(config, "lora_rank", 4), getattr(config, "lora_alpha", 1), fan_in,
                    fan_out, kind)


class JinaEmbeddingsV3Embeddings(GteEmbeddings):
    """GTE's embeddings, with the task adapters of the word and token type tables."""

    def __init__(self, config: JinaEmbeddingsV3Config):
        super().__init__(config)
        if config.tasks:
            h = config.hidden_size
            tables = {"word_embeddings": _adapters(config, config.vocab_size, h, "embedding")}
            if config.type_vocab_size:
                tables["token_type_embeddings"] = _adapters(config, config.type_vocab_size, h, "embedding")
            self.lora = nn.ModuleDict(tables)

    def _adapted(self, name: str, ids: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        rows = selection()
        if rows is None or "lora" not in self._modules:
            return vectors
        return vectors + self.lora[name].embedding_delta(ids, rows, vectors.dtype)

    def words(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._adapted("word_embeddings", input_ids, super().words(input_ids))

    def types(self, token_type_ids: torch.Tensor) -> torch.Tensor:
        return self._adapted("token_type_embeddings", token_type_ids, super().types(token_type_ids))


class JinaEmbeddingsV3Pooler(BertPooler):
    """BERT's pooler, with its dense layer's task adapters."""

    def __init__(self, config: JinaEmbeddingsV3Config):
        super().__init__(config)
        if config.tasks:
            self.lora = _adapters(config, config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        first = hidden[:, 0]
        out = self.dense(first)
        rows = selection()
        if rows is not None and "lora" in self._modules:
            out = self.lora.add(out, first, rows)
        return self.activation(out)


class JinaEmbeddingsV3MLP(nn.Module):
    """fc1, hidden_act, fc2."""

    def __init__(self, config: JinaEmbeddingsV3Config):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.hidden_act = config.hidden_act


class JinaEmbeddingsV3Layer(GteLayer):
    """GTE's layer (rotary attention, post-LN) with BERT's feed-forward."""

    ffn_gated = False
    ffn_up = None
    ffn_inner_dropout_p = 0.0
    ffn_input = property(lambda self: self.mlp.fc1)
    ffn_output = property(lambda self: self.mlp.fc2)

    def make_mlp(self, config: JinaEmbeddingsV3Config) -> nn.Module:
        return JinaEmbeddingsV3MLP(config)

    def __init__(self, config: JinaEmbeddingsV3Config):
        super().__init__(config)
        if config.tasks:
            h, i = config.hidden_size, config.intermediate_size
            shapes = {"qkv": (h, 3 * h), "attention_output": (h, h), "ffn_input": (h, i), "ffn_output": (i, h)}
            self.lora = nn.ModuleDict({role: _adapters(config, *shapes[role]) for role in LAYER_ROLES})

    def linear_slots(self):
        a, m = self.self_attn, self.mlp
        return [(a, "q_proj"), (a, "k_proj"), (a, "v_proj"), (a, "o_proj"), (m, "fc1"), (m, "fc2")]

    def adapted(self, hidden: torch.Tensor, mask: Optional[torch.Tensor], packed, bias: Optional[torch.Tensor],
                head_scale: Optional[torch.Tensor], want_probs: bool, rows):
        """forward with the task adapters: each linear layer's output plus its adapters' side product
        for the rows' tasks (rows: one task index, or one per row of hidden broadcast against its rows:
        [tokens] packed, [batch, 1] padded) -> (hidden, probabilities or None)."""
        seeds = DropoutSeeds() if self.training else None
        lora = self.lora

        def extra(role: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return lora[role].add(y, x, rows)

        qkv = extra("qkv", hidden, ops.linear(hidden, *self.self_attention.qkv_weight(), backend=self.backend))
        ctx, probs = self.attend(qkv, hidden.shape, mask, packed, bias, head_scale, want_probs, None, seeds)
        return self.feed_forward(ctx, hidden, seeds, extra), probs


class _Tasks:
    """task= / adapter_mask= on a forward, fold_task, from_pretrained(..., task=): the base model's
    and each head's."""

    def _selection(self, args, kwargs, task, adapter_mask):
        if task is None and adapter_mask is None:
            return None
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            x = kwargs.get("inputs_embeds", args[4] if len(args) > 4 else None)
        if x is None:
            raise ValueError(f"fastbert.{type(self).__name__}: task= needs input_ids or inputs_embeds")
        return task_rows(self.config.tasks, x.shape[0], x.device, task, adapter_mask, f"fastbert.{type(self).__name__}")

    def __init_subclass__(cls, **kwargs):
        """Each class's forward: its family's, with task (a task name, or one name or None per row)
        or adapter_mask (a task index per row) keyword arguments that run the task adapters (none
        where neither is given); its signature the family's and those two (transformers' Trainer
        reads it to keep the dataset's columns)."""
        super().__init_subclass__(**kwargs)
        family = getattr(super(_Tasks, cls), "forward", None)
        if "forward" in vars(cls) or family is None:
            return

        def forward(self, *args, adapter_mask=None, task=None, **kw):
            with selecting(self._selection(args, kw, task, adapter_mask)):
                return family(self, *args, **kw)

        sig = inspect.signature(family)
        params = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
        params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
                   for name in ("adapter_mask", "task")]
        params += [p for p in sig.parameters.values() if p.kind == p.VAR_KEYWORD]
        forward.__signature__ = sig.replace(parameters=params)
        forward.__doc__ = family.__doc__
        forward.__qualname__ = f"{cls.__qualname__}.forward"
        cls.forward = forward

    @torch.no_grad()
    def fold_task(self, task: str):
        """Fold task `task`'s adapters into the weights for good and drop every adapter: the model is
        then the original model run with that task, on every inference route (int8, CUDA graphs)
        and saved as a plain checkpoint (config.folded_task names the task). Returns self."""
        base, config = self.base_model, self.config
        where = f"fastbert.{type(self).__name__}.fold_task"
        if self.quantized:
            raise RuntimeError(f"{where}: the model is quantized; fold a task before quantizing "
                               "(from_pretrained(..., task=..., quantize='int8') does both in that order)")
        if task not in config.tasks:
            raise ValueError(f"{where}: unknown task {task!r}; this model's tasks: {', '.join(config.tasks) or 'none'}")
        t = config.tasks.index(task)
        emb = base.embeddings
        for name, table in emb.lora.items():
            weight = getattr(emb, name).weight
            weight += table.weight_delta(t).to(weight.dtype)
        for layer in base.layers:
            lora = layer.lora
            q, k, v = layer.self_attention.qkv_parameters()[:3]
            for w, d in zip((q, k, v), lora["qkv"].weight_delta(t).chunk(3)):
                w += d.to(w.dtype)
            for role in LAYER_ROLES[1:]:
                w = getattr(layer, role).weight
                w += lora[role].weight_delta(t).to(w.dtype)
            del layer.lora
        del emb.lora
        if base.pooler is not None:
            base.pooler.dense.weight += base.pooler.lora.weight_delta(t).to(base.pooler.dense.weight.dtype)
            del base.pooler.lora
        for c in {id(config): config, id(base.config): base.config}.values():
            c.lora_adaptations, c.folded_task = None, task
        return self

    @classmethod
    def from_pretrained(cls, path: str, *args, task: Optional[str] = None, **kwargs):
        """The family's from_pretrained; task= folds that task's adapters into the weights
        (fold_task) before any quantize= runs."""
        quantize = kwargs.pop("quantize", None) if task is not None else None
        loaded = super().from_pretrained(path, *args, **kwargs)
        if task is not None:
            model = loaded[0] if isinstance(loaded, tuple) else loaded
            model.fold_task(task)
            if quantize is not None:
                model.quantize_(quantize)
        return loaded


class JinaEmbeddingsV3Model(_Tasks, GteModel):
    """embeddings -> layers -> pooler (by default, as transformers' JinaEmbeddingsV3Model); the
    task adapters where the config names tasks."""

    config_class = JinaEmbeddingsV3Config
    base_model_prefix = "roberta"
    embeddings_class = JinaEmbeddingsV3Embeddings
    pooler_class = JinaEmbeddingsV3Pooler
    layer_class = JinaEmbeddingsV3Layer
    checkpoint_format = CHECKPOINT_FORMAT

    def __init__(self, config: JinaEmbeddingsV3Config, add_pooling_layer: bool = True):
        super().__init__(config, add_pooling_layer)

    def graphs_for(self, input_ids):
        return None if selection() is not None else super().graphs_for(input_ids)

    def _layers(self, h, *, mask, packed, bias, scales, rel, want_states: bool, want_probs: bool, first, shape):
        """BertModel's loop; with a task selected, the layers one by one with their adapters (the
        inference routes that run the stack in one call have none)."""
        rows = selection()
        if rows is None or not self.config.tasks:
            return super()._layers(h, mask=mask, packed=packed, bias=bias, scales=scales, rel=rel,
                                   want_states=want_states, want_probs=want_probs, first=first, shape=shape)
        if self.quantized:
            raise RuntimeError("fastbert.JinaEmbeddingsV3Model: a quantized model runs no task adapters; fold "
                               "one task before quantizing: from_pretrained(..., task=..., quantize='int8')")
        if not isinstance(rows, int):  # a task index for each row of h
            rows = rows[:, None] if packed is None else rows.repeat_interleave(
                packed[0].diff().long(), output_size=h.shape[0])
        states, probs = [], []
        for layer, scale in zip(self.layers, scales):
            h, p = self._run_layer(layer.adapted, h, mask, packed, bias, scale, want_probs, rows)
            if want_states:
                states.append(h)
            if want_probs:
                probs.append(p)
        return (h, *states, *probs)


class _JinaHead(_Tasks):
    config_class = JinaEmbeddingsV3Config
    model_class = JinaEmbeddingsV3Model
    checkpoint_format = CHECKPOINT_FORMAT


class JinaEmbeddingsV3ForMaskedLM(_JinaHead, RobertaForMaskedLM):
    pass


class JinaEmbeddingsV3ForSequenceClassification(_JinaHead, RobertaForSequenceClassification):
    pass


class JinaEmbeddingsV3ForTokenClassification(_JinaHead, RobertaForTokenClassification):
    pass


class JinaEmbeddingsV3ForQuestionAnswering(_JinaHead, RobertaForQuestionAnswering):
    pass


JINA_EMBEDDINGS_V3_CLASSES = (JinaEmbeddingsV3Model, JinaEmbeddingsV3ForMaskedLM,
                              JinaEmbeddingsV3ForSequenceClassification, JinaEmbeddingsV3ForTokenClassification,
                              JinaEmbeddingsV3ForQuestionAnswering)
