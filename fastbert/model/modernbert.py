"""ModernBERT on fastbert's ops, a drop-in for transformers' ModernBERT classes: the encoder
(modernbert_heads.py has the task models).

Same config fields, module and parameter names as transformers' modeling_modernbert (so state
dicts move both ways unchanged), same forward arguments and outputs. A pre-LN encoder:

    embeddings = dropout(LayerNorm(tok_embeddings(ids)))   (no positions: rotary, inside attention)
    -> unpad once -> N x [h = h + Wo(attention(Wqkv(attn_norm(h))))       (attn_norm: Identity in layer 0)
                         h = h + Wo(dropout(gelu(a) * b)), a, b = Wi(mlp_norm(h))]
    -> final_norm -> pad once

Through fastbert.ops: every projection is ops.linear; attention is ops.attention (padded) or
ops.varlen_attention (packed), which rotate q and k by the layer's rotary embedding
(rope_parameters[layer_type]["rope_theta"]) inside the kernel and, in the sliding layers, give each
query the keys at most local_attention // 2 positions away (window); the GeGLU is ops.geglu; every
LayerNorm that follows a residual add is ops.add_layer_norm (no bias when norm_bias is False); as
pre-LN keeps the residual stream as well as its norm, the layers take both from it in one pass
(return_sum=True: the sum it normalises is the stream). The LayerNorms with no residual add before
them (the embeddings', the prediction head's) are F.layer_norm.

A batch with padding runs packed (real tokens only, rotary positions counted within each
sequence); a batch without padding, or any batch while torch.compile traces (fullgraph, no graph
breaks: the packed shapes depend on the mask's values; the value checks of input_ids and
position_ids are skipped then, as BERT's are), runs padded. The two agree at real tokens
(rotary scores depend only on the distance between tokens); hidden states at padded positions are
zero on the packed path and not defined in general.

Also as for BERT: int8 inference (quantize_("int8"), from_pretrained(quantize="int8"):
ModernBertModel._int8_layer); output_attentions (each layer's probabilities as transformers' eager attention
gives them, padded rows and the window included: the layers then run padded and spell the attention
out, ModernBertAttention._spelled_out); bfloat16 models and autocast. Not supported, each a
NotImplementedError naming it: head_mask (transformers' ModernBERT has none either), position_ids
that do not count 0, 1, 2, ... along each row (up to a constant), and a 3-D / 4-D attention mask
that is not a padding mask.
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops, reference
from fastbert.model import stack_plan
from fastbert.model.config import OTHER_ACTIVATIONS, ModernBertConfig
from fastbert.model.layers import BackendMixin, embed_words, gate_form, gated_activation
from fastbert.model.model_utils import trunc_normal_
from fastbert.model.prenorm import PreNormForward
from fastbert.model.pretrained import BertPreTrainedModel
from fastbert.model.quantize import TRAINING_ERROR, InferenceOnly
from fastbert.model.stack_plan import module_of
from fastbert.ops import encoder, layer_training
from fastbert.ops.attention import joined_attention
from fastbert.ops.bias_gelu import GELU_FORMS


def activation(x: torch.Tensor, bias: Optional[torch.Tensor], name: str, backend) -> torch.Tensor:
    """act(x + bias) for one of the config's activations (bias may be None); GELU with a bias fused."""
    if name in GELU_FORMS:
        if bias is not None:
            return ops.bias_gelu(x, bias, GELU_FORMS[name], backend=backend)
        return F.gelu(x, approximate=GELU_FORMS[name])
    return OTHER_ACTIVATIONS[name](x if bias is None else x + bias)


def add_norm(norm: nn.Module, x: torch.Tensor, residual: Optional[torch.Tensor], backend) -> torch.Tensor:
    """norm(x + residual) (norm(x) without a residual); a LayerNorm after a residual add runs fused."""
    if isinstance(norm, nn.Identity):
        return x if residual is None else x + residual
    if residual is None:
        return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)
    return ops.add_layer_norm(x, residual, norm.weight, norm.bias, norm.eps, backend=backend)


def add_norm_sum(norm: nn.Module, x: torch.Tensor, residual: torch.Tensor, backend) -> Tuple[torch.Tensor, torch.Tensor]:
    """(norm(s), s), s = x + residual: a pre-LN layer's norm and its residual stream, in one fused pass."""
    if isinstance(norm, nn.Identity):
        s = x + residual
        return s, s
    return ops.add_layer_norm(x, residual, norm.weight, norm.bias, norm.eps, return_sum=True, backend=backend)


class ModernBertEmbeddings(nn.Module, BackendMixin):
    """tok_embeddings, LayerNorm (norm), dropout (drop)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.drop = nn.Dropout(config.embedding_dropout)
        self.max_tokens = config.max_position_embeddings  # the length ModernBERT was trained to (not a limit)

    def forward(self, input_ids: Optional[torch.Tensor], inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        words = embed_words(self.tok_embeddings, input_ids) if inputs_embeds is None else inputs_embeds
        return self.drop(add_norm(self.norm, words, None, self.backend))


class ModernBertAttention(nn.Module, BackendMixin):
    """Wqkv (one [3 hidden, hidden] projection), attention with the layer's rotary embedding (and
    window, in a sliding layer), Wo, dropout (out_drop)."""

    def __init__(self, config: ModernBertConfig, layer_idx: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.attention_dropout = config.attention_dropout
        self.out_drop = nn.Dropout(config.attention_dropout) if config.attention_dropout > 0 else nn.Identity()
        layer_type = config.layer_types[layer_idx]
        self.rope_theta = config.rope_theta(layer_type)
        # keys at most `window` positions away on either side; None: every key
        self.window = config.sliding_window if layer_type == "sliding_attention" else None

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], packed: Optional[Tuple[torch.Tensor, int]],
                want_probs: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x: [tokens, hidden] packed (packed = (cu_seqlens, max_seqlen)) or [batch, seq, hidden]
        padded (mask [batch, seq] or None) -> (the same shape, probabilities or None: see attend)."""
        qkv = ops.linear(x, self.Wqkv.weight, self.Wqkv.bias, backend=self.backend)
        ctx, probs = self.attend(qkv, x.shape, mask, packed, want_probs)
        return self.out_drop(ops.linear(ctx, self.Wo.weight, self.Wo.bias, backend=self.backend)), probs

    def attend(self, qkv: torch.Tensor, shape, mask: Optional[torch.Tensor], packed: Optional[Tuple[torch.Tensor, int]],
               want_probs: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The attention on the Wqkv projection qkv [..., 3 hidden] of a hidden state of shape `shape`
        (its rows, flattened or not) -> (context shaped `shape`, probabilities [batch, heads, seq,
        seq] when want_probs on the padded layout, else None)."""
        heads, d = self.num_heads, self.head_dim
        dropout_p = self.attention_dropout if self.training else 0.0
        opts = dict(dropout_p=dropout_p, rotary_base=self.rope_theta, window=self.window, backend=self.backend)
        if not want_probs:
            ctx = joined_attention(qkv, shape, heads, mask, packed, seed=None, **opts)
            if ctx is not None:
                return ctx, None
        if packed is not None:
            q, k, v = qkv.view(-1, 3, heads, d).unbind(1)  # [tokens, heads, d] each
            # cu_seqlens: the model's own (ops.unpad's), not read again on the host
            return ops.varlen_attention(q, k, v, packed[0], packed[1], validate=False, **opts).reshape(shape), None
        bsz, seq = shape[:2]
        q, k, v = qkv.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # [batch, heads, seq, d]
        probs = None
        if want_probs:
            ctx, probs = self._spelled_out(q, k, v, mask, dropout_p)
        else:
            ctx = ops.attention(q, k, v, mask, **opts)
        return ctx.transpose(1, 2).reshape(shape), probs

    def _spelled_out(self, q, k, v, mask: Optional[torch.Tensor], dropout_p: float):
        """(context, probabilities) as transformers' eager attention forms them: q and k rotated, the
        keys outside the window or padded masked with float32's minimum, not -inf (so that a query
        with no real key in its window, a padded one, spreads evenly over every key, as there)."""
        seq = q.shape[2]
        cos, sin = reference.rotary_tables(self.rope_theta, self.head_dim, seq, q.device)
        q, k = reference.rotate(q, cos, sin), reference.rotate(k, cos, sin)
        allowed = torch.ones(seq, seq, dtype=torch.bool, device=q.device)
        if self.window is not None:
            allowed = reference.window_band(seq, self.window, q.device)
        allowed = allowed[None, None] if mask is None else allowed[None, None] & mask.to(torch.bool)[:, None, None, :]
        bias = torch.zeros(allowed.shape, device=q.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
        return ops.attention_weights(q, k, v, bias, dropout_p=dropout_p)


class ModernBertMLP(nn.Module, BackendMixin):
    """Wi to [input, gate], act(input) * gate (one fused GeGLU for the GELU forms), dropout (drop), Wo."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = config.hidden_activation
        self.drop = nn.Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gated(ops.linear(x, self.Wi.weight, self.Wi.bias, backend=self.backend))
        return ops.linear(self.drop(h), self.Wo.weight, self.Wo.bias, backend=self.backend)

    def gated(self, h: torch.Tensor) -> torch.Tensor:
        """act(input) * gate of Wi's output h = [input, gate] (one fused GeGLU for the GELU forms)."""
        return gated_activation(h, self.act, self.backend)


class ModernBertEncoderLayer(nn.Module, BackendMixin):
    """attn_norm (Identity in layer 0), attn, mlp_norm, mlp: h + attn(attn_norm(h)), then + mlp(mlp_norm(.))."""

    def __init__(self, config: ModernBertConfig, layer_idx: int):
        super().__init__()
        if layer_idx == 0:
            self.attn_norm = nn.Identity()  # the embeddings end in a LayerNorm
        else:
            self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.attn = ModernBertAttention(config, layer_idx)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.mlp = ModernBertMLP(config)
        self.attention_type = config.layer_types[layer_idx]

    def linear_slots(self):
        """(owner module, attribute name) of the four linear layers: Wqkv, the attention's Wo, Wi, the
        MLP's Wo (int8 swaps them)."""
        return [(self.attn, "Wqkv"), (self.attn, "Wo"), (self.mlp, "Wi"), (self.mlp, "Wo")]

    def _inference_reads(self):
        """(the layer's tensors, heads, both eps, the GeGLU's GELU form, the rotary base, the window) as
        fastbert.ops.encoder.prenorm_layer_forward takes them, where the layer takes that route (the
        same kernels, without each op's Python): float linear layers, a GELU GeGLU, LayerNorms (layer
        0's attention norm an Identity); else None. Each module read once (a read costs the host about
        a microsecond). The caller checks inference (grad mode off, eval, not while torch.compile
        traces or under autocast)."""
        an, attn, mn, mlp = self.attn_norm, self.attn, self.mlp_norm, self.mlp
        act = mlp.act
        qkv, wo, wi, wf = attn.Wqkv, attn.Wo, mlp.Wi, mlp.Wo
        first = type(module_of(an)) is nn.Identity  # (module_of: self may be a stack_plan.Reader of the layer)
        if (act not in GELU_FORMS or type(module_of(mn)) is not nn.LayerNorm
                or not (first or type(module_of(an)) is nn.LayerNorm)
                or any(type(module_of(m)) is not nn.Linear for m in (qkv, wo, wi, wf))):
            return None
        weights = encoder.PreNormLayerWeights(None if first else an.weight, None if first else an.bias, qkv.weight,
                                              qkv.bias, wo.weight, wo.bias, mn.weight, mn.bias, wi.weight, wi.bias,
                                              wf.weight, wf.bias)
        window = attn.window
        return (weights, attn.num_heads, (0.0 if first else an.eps, mn.eps), GELU_FORMS[act], attn.rope_theta,
                -1 if window is None else window)

    def _training_node(self, h: torch.Tensor, delta: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                       packed: Optional[Tuple[torch.Tensor, int]]) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(h', delta') through the pre-LN layer's autograd node (fastbert.ops.layer_training) where
        it runs: a gradient to come on the Triton backend, plain linear layers and LayerNorms, a GELU
        GeGLU, no dropout (ModernBERT's are 0 by default; any other takes the separate ops); else None."""
        attn, mlp, an, mn = self.attn, self.mlp, self.attn_norm, self.mlp_norm
        if mlp.act not in GELU_FORMS or not layer_training.applies(h, self.backend, attn.head_dim):
            return None
        lin = (attn.Wqkv, attn.Wo, mlp.Wi, mlp.Wo)
        first = delta is None
        if (any(type(m) is not nn.Linear for m in lin) or type(mn) is not nn.LayerNorm
                or type(an) is not (nn.Identity if first else nn.LayerNorm)
                or (self.training and (attn.attention_dropout > 0 or mlp.drop.p > 0))):
            return None
        window = -1 if attn.window is None else attn.window
        opts = layer_training.PreNormLayer(attn.num_heads, (0.0 if first else an.eps, mn.eps), GELU_FORMS[mlp.act],
                                           attn.rope_theta, window)
        cu, n = packed if packed is not None else (None, None)
        return layer_training.prenorm_training_forward(
            h, delta, h.shape, mask, cu, n, opts, (None, None) if first else (an.weight, an.bias),
            *((m.weight, m.bias) for m in lin[:2]), (mn.weight, mn.bias), *((m.weight, m.bias) for m in lin[2:]))

    def forward(self, h: torch.Tensor, delta: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                packed: Optional[Tuple[torch.Tensor, int]], want_probs: bool = False):
        """The residual stream enters as h + delta (delta: the previous layer's MLP output, None
        before the first layer) and leaves as the returned (h', delta', probabilities or None), so
        that each LayerNorm reads the sum in its fused add (rows as in ModernBertAttention.forward)."""
        reads = None if want_probs or self.training or not encoder.inference_now() else self._inference_reads()
        if reads is not None:
            out = encoder.prenorm_layer_forward(h, delta, *reads, mask, *(packed or (None, None)), self.backend)
            if out is not None:
                return (*out, None)
        if not want_probs:
            out = self._training_node(h, delta, mask, packed)
            if out is not None:
                return (*out, None)
        if delta is None:  # the first layer: the stream is the embeddings' output
            stream, normed = h, add_norm(self.attn_norm, h, None, self.backend)
        else:
            normed, stream = add_norm_sum(self.attn_norm, delta, h, self.backend)
        out, probs = self.attn(normed, mask, packed, want_probs)
        normed, stream = add_norm_sum(self.mlp_norm, out, stream, self.backend)
        return stream, self.mlp(normed), probs


# the layer's methods as defined: a layer whose forward or reads are others (a subclass's, or set on the
# class or the instance later) runs as it is, never from what the model keeps
_LAYER_FORWARD, _LAYER_READS = ModernBertEncoderLayer.forward, ModernBertEncoderLayer._inference_reads


def _kept_entry(layer) -> Optional[tuple]:
    """What a ModernBertModel keeps of a layer for its inference forwards (stack_plan.kept_reads;
    layer: a Reader of it): ModernBertEncoderLayer._inference_reads() and its backend, where its
    forward is the class's as defined, it is in eval mode and it takes that route; else None."""
    if (layer.training or getattr(layer.forward, "__func__", None) is not _LAYER_FORWARD
            or getattr(layer._inference_reads, "__func__", None) is not _LAYER_READS):
        return None
    reads = layer._inference_reads()
    return None if reads is None else (*reads, layer.backend)


class ModernBertPreTrainedModel(BertPreTrainedModel):
    """Weights init as transformers' (truncated normal), from_pretrained / save_pretrained in
    transformers' format, the backend setting."""

    config_class = ModernBertConfig
    base_model_prefix = "model"
    word_embeddings_name = "tok_embeddings"

    def _init_weights(self, module: nn.Module) -> None:
        cfg = self.config
        cutoff = cfg.initializer_cutoff_factor or 3.0
        std_in = cfg.initializer_range
        std_out = cfg.initializer_range / math.sqrt(2.0 * max(cfg.num_hidden_layers, 1))

        def init(m: nn.Module, std: float) -> None:
            trunc_normal_(m.weight, std, cutoff)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

        if isinstance(module, ModernBertEmbeddings):
            init(module.tok_embeddings, std_in)
        elif isinstance(module, ModernBertMLP):
            init(module.Wi, std_in)
            init(module.Wo, std_out)
        elif isinstance(module, ModernBertAttention):
            init(module.Wqkv, std_in)
            init(module.Wo, std_out)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        else:
            self._init_head(module, init, std_out, cfg.hidden_size ** -0.5)

    def _init_head(self, module: nn.Module, init, std_out: float, std_final: float) -> None:
        """The task heads' weights (modernbert_heads.py)."""


class ModernBertModel(PreNormForward, ModernBertPreTrainedModel):
    """embeddings -> layers -> final_norm; forward as transformers' ModernBertModel (PreNormForward's:
    unpad_inputs False keeps every batch padded)."""

    family = "ModernBERT"

    def __init__(self, config: ModernBertConfig, add_pooling_layer: bool = False):
        super().__init__(config)  # (add_pooling_layer: ModernBERT has no pooler)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList([ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.pooler = None  # (none: what code that reads a base model's pooler finds)
        self.post_init()

    def embed(self, input_ids: Optional[torch.Tensor], inputs_embeds: Optional[torch.Tensor]) -> torch.Tensor:
        return self.embeddings(input_ids, inputs_embeds)

    def packed_encode(self, ids, types, positions, cu_seqlens, max_seqlen: int):
        """The embeddings, every layer and final_norm on packed tokens -> rows [tokens, hidden] (what a
        CUDA graph captures; the rotary positions come from cu_seqlens: types and positions unread)."""
        h = self.embeddings(ids)
        return self._layers(h, mask=None, packed=(cu_seqlens, max_seqlen), want_states=False, want_probs=False,
                            shape=h.shape)[0]

    def _encode(self, h: torch.Tensor, mask, packed, to_output, want_states: bool, want_probs: bool):
        """(last_hidden_state: to_output of the layers' output after final_norm, the hidden states
        (to_output of each: the embeddings' output, then every layer's, the last after final_norm, as
        transformers gives them) or None, the probabilities or None); h: the embeddings' output, rows
        as in ModernBertAttention.forward (packed = (cu_seqlens, max_seqlen), or mask for the padded
        layout). Float and int8 layers alike run in the one loop of _layers."""
        int8 = self.quantized is not None
        if int8 and self.training:
            raise RuntimeError(TRAINING_ERROR)
        int8 = int8 and len(self.layers) > 0
        rows = h.reshape(-1, h.shape[-1]) if int8 else h
        run = functools.partial(self._layers, mask=mask, packed=packed, want_states=want_states,
                                want_probs=want_probs, shape=h.shape)
        if int8 and torch.is_grad_enabled() and rows.requires_grad:
            out = InferenceOnly.apply(rows, run)  # no gradient through int8 layers: its backward names the fix
        else:
            out = run(rows)
        n_out = len(self.layers) + 1 if want_states else 1
        outs = [to_output(o.view(h.shape)) for o in out[:n_out]]
        probs = tuple(out[n_out:]) if want_probs else None
        return outs[-1], (tuple(outs) if want_states else None), probs

    def _layers(self, h: torch.Tensor, *, mask, packed, want_states: bool, want_probs: bool, shape):
        """The loop over the layers, float or int8 (h then the rows [rows, hidden] of a hidden state
        of shape `shape`) -> (the output after final_norm, or with want_states: h, then every layer's
        output, the last after final_norm; then each layer's probabilities when want_probs)."""
        layers = list(self.layers)
        int8 = self.quantized is not None and len(layers) > 0
        if not int8 and not want_states and not want_probs and layers:
            out = self._kept_layers(h, tuple(layers), mask, packed)
            if out is not None:
                return (self.apply_final_norm(*out),)
        states, probs = [h], []
        delta = None
        xq = ops.quantize_rows(h) if int8 else None  # layer 0's attn_norm is Identity (the embeddings end in a LayerNorm)
        for i, layer in enumerate(layers):
            if int8:
                last = i == len(layers) - 1
                norm = self.final_norm if last else layers[i + 1].attn_norm
                y, xq, h, p = self._int8_layer(layer, h, xq, norm, mask, packed, shape, last, want_states, want_probs)
                state = y if last else h
            else:
                h, delta, p = self._run_layer(layer, h, delta, mask, packed, want_probs)
                state = h + delta if want_states else None
            if want_states:
                states.append(state)
            probs.append(p)
        out = y if int8 else self.apply_final_norm(h, delta)
        if want_states:
            states[-1] = out  # transformers gives the last layer's output after final_norm
        return (*(states if want_states else [out]), *(probs if want_probs else ()))

    def _kept_layers(self, h: torch.Tensor, layers: tuple, mask, packed) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(h, delta) after every layer, each run as its forward would run it in inference, from
        what the model keeps of them (stack_plan.kept_reads: read again whenever anything they were
        read from changes), with no module read and no layer call; None where that route does not
        take them (training, a hook, a layer of another kind, layers of more than one backend)."""
        if not encoder.inference_now() or stack_plan.hooked(layers):
            return None
        entries = stack_plan.kept_reads(self, layers, _kept_entry).entries
        if entries is None or len({e[-1] for e in entries}) != 1:
            return None
        return encoder.prenorm_layers_forward(h, [e[:-1] for e in entries], mask, *(packed or (None, None)),
                                              entries[0][-1])

    def _int8_layer(self, layer, stream: torch.Tensor, xq, next_norm: nn.Module, mask, packed, shape, last: bool,
                    want_sum: bool, want_probs: bool):
        """One int8 ModernBertEncoderLayer on rows: stream [rows, hidden] and xq, the quantized rows
        of attn_norm(stream) -> (next_norm(the layer's output) (final_norm's after the last layer),
        its quantized rows (None after the last), the layer's output (None after the last unless
        want_sum), probabilities or None). The layer, its linear layers Int8Linear (biases or not):

            qkv   = int8_linear(x_q, Wqkv)                 -> attention (rotary, window) -> ctx
            m_q, h = int8_add_norm(quantize_rows(ctx), Wo, residual=h, mlp_norm)
            g_q   = int8_glu_rows(m_q, Wi)                 (GeGLU's product, gate and quantization in one pass)
            x_q, h = int8_add_norm(g_q, Wo, residual=h, next attn_norm)
                                          (final_norm after the last layer, whose output it is, unquantized)

        Each int8_add_norm gives the norm and the residual stream from one pass over the
        accumulator; int8_glu_rows writes no float [rows, 2 intermediate] or [rows, intermediate]
        tensor (an activation it does not fuse: the composed geglu on int8_linear's float rows)."""
        attn, mlp = layer.attn, layer.mlp
        qkv = encoder.int8_linear(xq, attn.Wqkv.weight, attn.Wqkv.weight_scale, attn.Wqkv.bias, stream.dtype)
        ctx, probs = attn.attend(qkv, stream.shape if packed is not None else shape, mask, packed, want_probs)
        ctx = ctx.reshape(-1, stream.shape[-1])
        norm = layer.mlp_norm
        _, mq, stream = encoder.int8_add_norm(ops.quantize_rows(ctx), attn.Wo.weight, attn.Wo.weight_scale, attn.Wo.bias,
                                              stream, norm.weight, norm.bias, norm.eps, True, True)
        form = gate_form(mlp.act)
        if form is not None:
            gq = encoder.int8_glu_rows(mq, mlp.Wi.weight, mlp.Wi.weight_scale, mlp.Wi.bias, form)
        else:
            gq = ops.quantize_rows(mlp.gated(encoder.int8_linear(mq, mlp.Wi.weight, mlp.Wi.weight_scale, mlp.Wi.bias,
                                                                 stream.dtype)))
        y, yq, total = encoder.int8_add_norm(gq, mlp.Wo.weight, mlp.Wo.weight_scale, mlp.Wo.bias,
                                             stream, next_norm.weight, next_norm.bias, next_norm.eps, not last,
                                             want_sum or not last)
        return y, yq, total, probs

    def apply_final_norm(self, h: torch.Tensor, delta: Optional[torch.Tensor]) -> torch.Tensor:
        # (the model's backend as set_backend gave it to its modules); no layers: no delta
        backend = self.embeddings.backend
        return add_norm(self.final_norm, h, None, backend) if delta is None else add_norm(self.final_norm, delta, h, backend)
