"""The encoder's layers on fastbert.ops, with transformers' module and parameter names."""
from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import layouts, ops, reference
from fastbert.model.config import OTHER_ACTIVATIONS, BertConfig
from fastbert.model.joined import joined_linear, share_storage, trainable, views_of
from fastbert.model.quantize import Int8Linear
from fastbert.ops import layer_training
from fastbert.ops.attention import joined_attention
from fastbert.ops.bias_gelu import GELU_FORMS
from fastbert.ops.common import DropoutSeeds
from fastbert.ops.encoder import Int8LayerWeights, LayerWeights, inference_now, layer_forward


class BackendMixin:
    """Mixin: the fastbert.ops backend a module's ops run on (None: automatic), set model-wide."""

    backend: Optional[str] = None


def _plain_embedding(module: nn.Module) -> bool:
    """An nn.Embedding with none of the options ops.embedding leaves to F.embedding."""
    return (type(module) is nn.Embedding and module.max_norm is None and not module.scale_grad_by_freq
            and not module.sparse)


class BertEmbeddings(nn.Module, BackendMixin):
    """Word + position + token type embeddings, LayerNorm, dropout; `width` wide (ELECTRA's
    embedding_size; the hidden size otherwise). Positions count 0, 1, ... unless given."""

    def __init__(self, config: BertConfig, width: Optional[int] = None, position_padding_idx: Optional[int] = None,
                 token_types: bool = True):
        super().__init__()
        width = config.hidden_size if width is None else width
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width, padding_idx=position_padding_idx)
        if token_types:  # (DistilBERT has none)
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    @property
    def max_tokens(self) -> int:
        """The longest input the position table has room for."""
        return self.position_embeddings.num_embeddings

    def default_position_ids(self, input_ids: Optional[torch.Tensor], bsz: int, seq: int,
                             device: torch.device) -> torch.Tensor:
        return torch.arange(seq, device=device).expand(bsz, seq)

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds=None):
        words = self._words(input_ids) if inputs_embeds is None else inputs_embeds
        rest = self.position_embeddings(position_ids)
        if hasattr(self, "token_type_embeddings"):
            rest = self.token_type_embeddings(token_type_ids) + rest
        h = ops.add_layer_norm(
            words, rest.to(words.dtype), self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps,
            backend=self.backend,
        )
        return self.dropout(h)

    def _words(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed_words(self.word_embeddings, input_ids)


def embed_words(emb: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The word embeddings of input_ids: ops.embedding for a plain nn.Embedding; a module put in its
    place (set_input_embeddings) runs as it is."""
    if _plain_embedding(emb):
        return ops.embedding(input_ids, emb.weight, emb.padding_idx)
    return emb(input_ids)


class BertSelfAttention(nn.Module):
    # its projections, each nn.Linear(hidden, hidden): query, key, value (RenamedSelfAttention: a
    # family's own names, with the output projection)
    names: Tuple[str, ...] = ("query", "key", "value")

    def __init__(self, config: BertConfig, bias: bool = True):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.head_dim
        self.all_head_size = config.hidden_size
        for name in self.names:  # (bias False: NomicBERT's projections have none)
            setattr(self, name, nn.Linear(config.hidden_size, config.hidden_size, bias=bias))
        self.dropout_p = config.attention_probs_dropout_prob
        self._fused = (None, None)  # the QKV weight and bias, whose slices the three projections' parameters are

    def qkv_weight(self) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The three projections as one [3 * hidden, hidden] GEMM. The three weights (and biases)
        are views into one tensor, which is then the concatenation itself: no copy, and nothing that
        can fall behind the parameters (see views_of). Under autograd it enters the graph as their
        concatenation (joined.trainable: each gradient a slice of the joined one); while
        torch.compile traces, as torch.cat of them. The bias is None where the projections have none."""
        weights = (self.query.weight, self.key.weight, self.value.weight)
        biases = (self.query.bias, self.key.bias, self.value.bias)
        if torch.compiler.is_compiling():
            return torch.cat(weights), None if biases[0] is None else torch.cat(biases)
        w, b = self.fused_qkv()
        if torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in weights + biases):
            return trainable(w, b, weights, None if b is None else biases)
        return w, b

    def qkv_parameters(self) -> Tuple[torch.Tensor, ...]:
        """The three projections' weights, then their biases (query, key, value must be plain
        nn.Linear: the QKV route joins their parameters)."""
        q, k, v = self.query, self.key, self.value
        return q.weight, k.weight, v.weight, q.bias, k.bias, v.bias

    def fused_qkv(self, parts: Optional[Tuple[torch.Tensor, ...]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The joined QKV weight and bias whose row slices the three projections' parameters are
        (joined again first where one of them was given new memory): outside autograd's view.
        parts: qkv_parameters(), when the caller has read them."""
        parts = parts or self.qkv_parameters()
        w, b = self._fused
        biased = parts[3] is not None
        if not (views_of(w, parts[:3]) and (not biased or views_of(b, parts[3:]))):
            with torch.no_grad():
                self._fused = w, b = (share_storage(parts[:3]), share_storage(parts[3:]) if biased else None)
        return w, (b if biased else None)

    def joined_qkv(self) -> tuple:
        """The three projections' tensors, each kind joined into one: (weight, bias) as qkv_weight()
        gives them; once quantized (Int8Linear), (int8 weight, scale, bias)."""
        mods = (self.query, self.key, self.value)
        if isinstance(mods[0], Int8Linear):
            return joined_linear(self, "qkv", mods)
        return self.qkv_weight()


class RenamedSelfAttention(BertSelfAttention):
    """BertSelfAttention (its joined QKV included) for a family whose query, key, value and output
    projections are four nn.Linear under names of its own: `names`, in that order (DistilBERT's
    q_lin ... out_lin, MPNet's q ... o)."""

    names: Tuple[str, str, str, str] = ("query", "key", "value", "output")

    query = property(lambda self: getattr(self, self.names[0]))
    key = property(lambda self: getattr(self, self.names[1]))
    value = property(lambda self: getattr(self, self.names[2]))


class _DenseLayerNorm(nn.Module):
    """The tail of an attention or feed-forward block: dense (in_features -> hidden), dropout, and
    LayerNorm over the residual sum (run fused by BertLayer)."""

    def __init__(self, config: BertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class BertSelfOutput(_DenseLayerNorm):
    def __init__(self, config: BertConfig):
        super().__init__(config, config.hidden_size)


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


class BertOutput(_DenseLayerNorm):
    def __init__(self, config: BertConfig):
        super().__init__(config, config.intermediate_size)



def _dropout_p(module: nn.Module, p: float) -> float:
    return p if module.training else 0.0


def _take(seeds: Optional[DropoutSeeds], p: float) -> Optional[int]:
    # the seed of a dropout of probability p: from the layer's seeds, or None (the op draws one)
    return None if seeds is None else seeds.take(p)


def bias_activation(x: torch.Tensor, bias: torch.Tensor, act: str, backend) -> torch.Tensor:
    if act in GELU_FORMS:
        return ops.bias_gelu(x, bias, GELU_FORMS[act], backend=backend)
    return OTHER_ACTIVATIONS[act](x + bias)


def gate_form(act: str) -> Optional[str]:
    """How the fused gated units name the activation `act`: "none" or "tanh" (GELU's forms: GeGLU),
    "silu" (SwiGLU); None for an activation they do not fuse."""
    if act in GELU_FORMS:
        return GELU_FORMS[act]
    return "silu" if act in ("silu", "swish") else None


def gated_activation(h: torch.Tensor, act: str, backend) -> torch.Tensor:
    """act(a) * b of a gated feed-forward's joined input product h = [a, b] (one fused GeGLU for the
    GELU forms, one fused SwiGLU for SiLU)."""
    form = gate_form(act)
    if form == "silu":
        return ops.swiglu(h, backend=backend)
    if form is not None:
        return ops.geglu(h, form, backend=backend)
    a, b = h.chunk(2, dim=-1)
    return OTHER_ACTIVATIONS[act](a) * b


class BertLayer(nn.Module, BackendMixin):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    # What a family's layer may add to BERT's (GTE's): rotary positions inside the attention (their
    # base; None: the embeddings gave absolute positions) and a gated feed-forward (ffn_gated:
    # act(ffn_input(h)) * ffn_up(h), the two products joined into one, then ffn_output). The
    # extension's whole-layer routes (encoder.layer_forward, the stacks, the training node) run
    # neither: such a layer takes the separate ops, in every precision.
    rotary_base: Optional[float] = None
    ffn_gated: bool = False

    # The layer's parts by role. Everything that runs a layer (here, quantize.py) reads them through
    # these, so a family whose modules have other names (DistilBERT's TransformerBlock) is this
    # layer with these overridden.
    @property
    def self_attention(self):
        """query, key, value (nn.Linear), qkv_weight(), num_attention_heads, attention_head_size, dropout_p."""
        return self.attention.self

    @property
    def attention_output(self) -> nn.Linear:
        return self.attention.output.dense

    @property
    def attention_norm(self) -> nn.LayerNorm:
        return self.attention.output.LayerNorm

    @property
    def attention_dropout_p(self) -> float:
        return self.attention.output.dropout.p

    @property
    def ffn_input(self) -> nn.Linear:
        return self.intermediate.dense

    @property
    def ffn_act(self) -> str:
        return self.intermediate.hidden_act

    @property
    def ffn_output(self) -> nn.Linear:
        return self.output.dense

    @property
    def ffn_norm(self) -> nn.LayerNorm:
        return self.output.LayerNorm

    @property
    def ffn_dropout_p(self) -> float:
        return self.output.dropout.p

    # a gated feed-forward's second input product (ffn_gated) and the dropout between its activation
    # and ffn_output
    ffn_up: Optional[nn.Linear] = None
    ffn_inner_dropout_p: float = 0.0

    def gate_up(self) -> tuple:
        """A gated feed-forward's two input products (ffn_input, then ffn_up) as one GEMM
        (joined.joined_linear): (weight, bias or None); once quantized (Int8Linear), (int8 weight,
        scale, bias or None), as BertSelfAttention.joined_qkv gives the QKV's."""
        return joined_linear(self, "gate_up", (self.ffn_input, self.ffn_up))

    def linear_slots(self):
        """(owner module, attribute name) of the six linear layers: query, key, value, attention
        output, FFN input, FFN output (int8 swaps them)."""
        sa = self.attention.self
        return [(sa, "query"), (sa, "key"), (sa, "value"), (self.attention.output, "dense"), (self.intermediate, "dense"),
                (self.output, "dense")]

    def forward(self, hidden: torch.Tensor, mask: Optional[torch.Tensor], packed: Optional[Tuple[torch.Tensor, int]],
                bias: Optional[torch.Tensor] = None, head_scale: Optional[torch.Tensor] = None,
                want_probs: bool = False, relative_bias: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """hidden: [batch, seq, hidden] (padded path, mask [batch, seq] or None) or [tokens, hidden]
        (packed path, packed = (cu_seqlens, max_seqlen)). bias (an additive mask) or want_probs take
        the explicit attention path, which also returns the probabilities; head_scale [heads]
        multiplies each head's output; relative_bias [heads, 2n - 1] (n >= seq; MPNet's relative
        position bias) is added to the scaled scores by distance, as ops.attention takes it.
        -> (hidden, probabilities [batch, heads, seq, seq] or None). (A model whose layers' reads it
        keeps, BertModel.kept_layers, runs their inference route without this call.)"""
        if bias is None and head_scale is None and not want_probs and self._one_call():  # (BERT's layers only)
            mask, cu, n = (mask, None, None) if packed is None else (None, *packed)
            out = layer_forward(hidden, self.weights(), self.self_attention.num_attention_heads,
                                (self.attention_norm.eps, self.ffn_norm.eps), GELU_FORMS[self.ffn_act], mask, cu, n,
                                relative_bias, self.backend)
            return out, None
        seeds = DropoutSeeds() if self.training else None  # one draw for the layer's dropouts
        if bias is None and head_scale is None and not want_probs:
            out = self._training_node(hidden, mask, packed, relative_bias, seeds)
            if out is not None:
                return out, None
        qkv = ops.linear(hidden, *self.self_attention.qkv_weight(), backend=self.backend)
        ctx, probs = self.attend(qkv, hidden.shape, mask, packed, bias, head_scale, want_probs, relative_bias, seeds)
        return self.feed_forward(ctx, hidden, seeds), probs

    def _training_node(self, hidden: torch.Tensor, mask: Optional[torch.Tensor],
                       packed: Optional[Tuple[torch.Tensor, int]], relative_bias: Optional[torch.Tensor],
                       seeds: Optional[DropoutSeeds]) -> Optional[torch.Tensor]:
        """The layer as one autograd node (fastbert.ops.layer_training) where it runs: a gradient to
        come on the Triton backend, plain linear layers, a GELU feed-forward; else None. Each module
        is read once (a lookup costs the host about a microsecond, and a layer has some forty)."""
        sa, act = self.self_attention, self.ffn_act
        if (act not in GELU_FORMS or self.ffn_gated or self.rotary_base is not None
                or not layer_training.applies(hidden, self.backend, sa.attention_head_size)):
            return None
        out, n1, ffn_in, ffn_out, n2 = (self.attention_output, self.attention_norm, self.ffn_input, self.ffn_output,
                                        self.ffn_norm)
        if any(type(m) is not nn.Linear for m in (sa.query, sa.key, sa.value, out, ffn_in, ffn_out)):
            return None  # anything else in a linear layer's place: the separate ops, as before
        parts = sa.qkv_parameters()
        ps = (_dropout_p(self, sa.dropout_p), _dropout_p(self, self.attention_dropout_p),
              _dropout_p(self, self.ffn_dropout_p))
        opts = layer_training.TrainingLayer(sa.num_attention_heads, (n1.eps, n2.eps), GELU_FORMS[act], ps,
                                            tuple(_take(seeds, p) for p in ps))
        cu, n = packed if packed is not None else (None, None)
        return layer_training.layer_training_forward(
            hidden, hidden.shape, mask, cu, n, relative_bias, opts, sa.fused_qkv(parts), parts,
            (out.weight, out.bias), (n1.weight, n1.bias), (ffn_in.weight, ffn_in.bias), (ffn_out.weight, ffn_out.bias),
            (n2.weight, n2.bias))

    def _one_call(self) -> bool:
        """Whether the layer takes fastbert.ops.encoder's inference route (the same kernels, without
        each op's Python): inference (grad mode off, eval, not while torch.compile traces or under
        autocast, whose casts the separate ops make), float linear layers, a GELU feed-forward."""
        return (inference_now() and not self.training and self.ffn_act in GELU_FORMS
                and type(self.ffn_output) is nn.Linear and not self.ffn_gated and self.rotary_base is None)

    def weights(self) -> Union[LayerWeights, Int8LayerWeights]:
        """The layer's tensors as fastbert.ops.encoder takes them: LayerWeights, or Int8LayerWeights
        once its linear layers are Int8Linear."""
        return self.weights_with(self.self_attention.joined_qkv())

    def weights_with(self, qkv: tuple) -> Union[LayerWeights, Int8LayerWeights]:
        """weights(), the joined QKV tensors `qkv` given (self_attention.joined_qkv()). A gated
        feed-forward's two input products stand joined in the FFN input's place (gate_up())."""
        out, n1, ffn_out, n2 = self.attention_output, self.attention_norm, self.ffn_output, self.ffn_norm
        int8 = len(qkv) == 3
        if self.ffn_gated:
            ffn_in = self.gate_up()
        else:
            m = self.ffn_input
            ffn_in = (m.weight, m.weight_scale, m.bias) if int8 else (m.weight, m.bias)
        if int8:
            return Int8LayerWeights(*qkv, out.weight, out.weight_scale, out.bias, n1.weight, n1.bias, *ffn_in,
                                    ffn_out.weight, ffn_out.weight_scale, ffn_out.bias, n2.weight, n2.bias)
        return LayerWeights(*qkv, out.weight, out.bias, n1.weight, n1.bias, *ffn_in, ffn_out.weight, ffn_out.bias,
                            n2.weight, n2.bias)

    def feed_forward(self, ctx: torch.Tensor, hidden: torch.Tensor, seeds: Optional[DropoutSeeds] = None,
                     extra: Optional[Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
        """The layer after its attention: output projection of the context ctx, add & LayerNorm
        with the layer's input hidden, the feed-forward block, add & LayerNorm (rows of any shape).
        seeds: where the dropouts' seeds come from (None: each op draws its own). extra(role, x, y):
        the output y of the linear layer in `role` ("attention_output", "ffn_input", "ffn_output")
        for its input x, updated (task adapters: fastbert.model.lora)."""
        dense, ln = self.attention_output, self.attention_norm
        attn = ops.linear(ctx, dense.weight, dense.bias, backend=self.backend)
        if extra is not None:
            attn = extra("attention_output", ctx, attn)
        p = _dropout_p(self, self.attention_dropout_p)
        h1 = ops.add_layer_norm(attn, hidden, ln.weight, ln.bias, ln.eps, dropout_p=p, backend=self.backend,
                                seed=_take(seeds, p))
        if self.ffn_gated:
            if extra is not None:
                raise NotImplementedError("fastbert: task adapters on a gated feed-forward are not supported")
            inter = gated_activation(ops.linear(h1, *self.gate_up(), backend=self.backend), self.ffn_act, self.backend)
            p = _dropout_p(self, self.ffn_inner_dropout_p)
            inter = F.dropout(inter, p) if p > 0 else inter
        else:
            inter = ops.linear(h1, self.ffn_input.weight, backend=self.backend)
            if extra is not None:
                inter = extra("ffn_input", h1, inter)
            inter = bias_activation(inter, self.ffn_input.bias, self.ffn_act, self.backend)
        dense, ln = self.ffn_output, self.ffn_norm
        out = ops.linear(inter, dense.weight, dense.bias, backend=self.backend)
        if extra is not None:
            out = extra("ffn_output", inter, out)
        p = _dropout_p(self, self.ffn_dropout_p)
        return ops.add_layer_norm(out, h1, ln.weight, ln.bias, ln.eps, dropout_p=p, backend=self.backend,
                                  seed=_take(seeds, p))

    def first_tokens(self, hidden: torch.Tensor, mask: Optional[torch.Tensor],
                     unpadded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                     head_scale: Optional[torch.Tensor] = None,
                     relative_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """This layer's output at each sequence's first token only -> [batch, hidden]: what the
        pooler reads when it is all a model returns. Keys and values are projected at every token;
        the query, and everything after the attention, at the first token alone.

        hidden: [batch, seq, hidden] (mask [batch, seq] or None), or the packed rows [tokens, hidden]
        of the batch that ops.unpad(., mask) gave (indices, cu_seqlens) for. Every sequence's first
        token must be a real one (mask[:, 0] all set)."""
        sa = self.self_attention
        heads, d = sa.num_attention_heads, sa.attention_head_size
        width = heads * d
        w, b = sa.qkv_weight()
        kv = ops.linear(hidden, w[width:], b[width:], backend=self.backend)
        if unpadded is None:
            first = hidden[:, 0]
        else:
            indices, cu_seqlens = unpadded
            first = hidden[cu_seqlens[:-1].long()]
            kv = ops.pad(kv, indices, *mask.shape)
        bsz, seq = kv.shape[:2]
        q = ops.linear(first, w[:width], b[:width], backend=self.backend).view(bsz, heads, 1, d)
        k, v = kv.view(bsz, seq, 2, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # [batch, heads, seq, d]
        keys = None if mask is None else mask.to(torch.bool)[:, None, None, :]
        if relative_bias is not None:  # the first query's row: distances 0 .. seq - 1
            n = (relative_bias.shape[-1] + 1) // 2
            row = relative_bias[:, n - 1:n - 1 + seq].to(q.dtype)[None, :, None, :]
            keys = row if keys is None else row.masked_fill(~keys, float("-inf"))
        ctx = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=keys,
                                             dropout_p=_dropout_p(self, sa.dropout_p))
        if head_scale is not None:
            ctx = ctx * head_scale.to(ctx.dtype).view(1, heads, 1, 1)
        return self.feed_forward(ctx.reshape(bsz, width), first)

    def attend(self, qkv: torch.Tensor, shape, mask: Optional[torch.Tensor], packed: Optional[Tuple[torch.Tensor, int]],
               bias: Optional[torch.Tensor] = None, head_scale: Optional[torch.Tensor] = None,
               want_probs: bool = False, relative_bias: Optional[torch.Tensor] = None,
               seeds: Optional[DropoutSeeds] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The attention of this layer on the QKV projection qkv [..., 3 * hidden] of a hidden state
        of shape `shape` ([tokens, hidden] packed, [batch, seq, hidden] padded; qkv may hold the rows
        of either flattened) -> (context [..., hidden] shaped `shape`, probabilities or None); the
        arguments as in forward (seeds: as feed_forward's). packed's cu_seqlens are the model's own
        (fastbert.ops.unpad's), not read again on the host."""
        sa = self.self_attention
        heads, d = sa.num_attention_heads, sa.attention_head_size
        p_attn = _dropout_p(self, sa.dropout_p)
        rotary = self.rotary_base
        probs = None
        if head_scale is None and bias is None and not want_probs:
            ctx = joined_attention(qkv, shape, heads, mask, packed, dropout_p=p_attn, seed=_take(seeds, p_attn),
                                   backend=self.backend, relative_bias=relative_bias, rotary_base=rotary)
            if ctx is not None:
                return ctx, None
        if packed is not None:
            q, k, v = qkv.view(-1, 3, heads, d).unbind(1)  # [tokens, heads, d] each
            ctx = ops.varlen_attention(q, k, v, packed[0], packed[1], dropout_p=p_attn, backend=self.backend,
                                       relative_bias=relative_bias, seed=_take(seeds, p_attn), validate=False,
                                       rotary_base=rotary)
            if head_scale is not None:
                ctx = ctx * head_scale.to(ctx.dtype).view(1, heads, 1)
            return ctx.reshape(shape), None
        bsz, seq = shape[:2]
        q, k, v = qkv.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # [batch, heads, seq, d]
        if bias is not None or want_probs:
            if bias is None and mask is not None:
                bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, float("-inf"))
                bias = bias[:, None, None, :]
            if relative_bias is not None:  # spread to [heads, seq, seq] for the explicit path
                spread = layouts.relative_bias_matrix(relative_bias, seq).float()
                bias = spread if bias is None else bias + spread
            if rotary is not None:  # q and k rotated at their positions, as the fused kernels rotate them
                cos, sin = reference.rotary_tables(rotary, d, seq, q.device)
                q, k = reference.rotate(q, cos, sin), reference.rotate(k, cos, sin)
            ctx, probs = ops.attention_weights(q, k, v, bias, dropout_p=p_attn)
        else:
            ctx = ops.attention(q, k, v, mask, dropout_p=p_attn, backend=self.backend, relative_bias=relative_bias,
                                seed=_take(seeds, p_attn), rotary_base=rotary)
        if head_scale is not None:
            ctx = ctx * head_scale.to(ctx.dtype).view(1, heads, 1, 1)
        return ctx.transpose(1, 2).reshape(bsz, seq, heads * d), probs


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


class BertPredictionHeadTransform(nn.Module, BackendMixin):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.hidden_act = config.hidden_act
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = ops.linear(hidden, self.dense.weight, backend=self.backend)
        h = bias_activation(h, self.dense.bias, self.hidden_act, self.backend)
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
