"""BertPreTrainedModel: weight init, the backend setting, and from_pretrained / save_pretrained
in transformers' format."""
from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import warnings
from typing import Dict, Iterator, Optional

import torch
import torch.utils.checkpoint
from torch import nn

from fastbert import backend as fb_backend
from fastbert.model import stack_plan
from fastbert.model.checkpoint import (
    SAFE_WEIGHTS_NAME,
    WEIGHTS_NAME,
    KeyFormat,
    apply_config_overrides,
    load_state_dict,
    match_state_dict,
    resolve_load_dtype,
)
from fastbert.model.config import BertConfig
from fastbert.model.layers import BackendMixin, BertLMPredictionHead
from fastbert.model.model_utils import ModelUtilsMixin
from fastbert.model.quantize import CONFIG_KEY, check_quantize, quantize_model, recorded
from fastbert.model.trainer_save import patch_trainer_if_loaded
from fastbert.ops import encoder


class BertPreTrainedModel(ModelUtilsMixin, nn.Module):
    """Weights init as transformers', from_pretrained / save_pretrained in transformers' format."""

    base_model_prefix = "bert"
    config_class = BertConfig  # each family's own (RobertaConfig, ...): what from_pretrained reads
    # keys that share a tensor with another key: not written by save_pretrained, tied on load
    _tied_weights_keys: Dict[str, str] = {}
    # how the family's checkpoint files name weights where they differ from the modules (GTE's); None: alike
    checkpoint_format: Optional[KeyFormat] = None

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"fastbert: {type(self).__name__} takes a fastbert.{self.config_class.__name__}, "
                            f"got {type(config).__name__}")
        self.config = config
        self._backend: Optional[str] = None
        patch_trainer_if_loaded(BertPreTrainedModel)

    quantized: Optional[str] = None  # "int8" after quantize_("int8")
    quantization: Optional[dict] = None  # its settings: {"mode": "int8", "weight_range": 127} (fastbert.model.quantize)
    gradient_checkpointing: bool = False  # set by gradient_checkpointing_enable() on the base model
    cuda_graph_limit: int = 0  # the CUDA graphs cuda_graphs() keeps on the base model (0: none, eager)
    _cuda_graphs: Optional[encoder.EncoderGraphs] = None  # made at the first forward that runs them

    def _return_dict(self, return_dict) -> bool:
        return self.config.use_return_dict if return_dict is None else return_dict

    def _apply(self, fn, recurse=True):
        # to() / half() / cuda(): the plan of the one-call stack (fastbert.model.stack_plan) and the
        # CUDA graphs hold the layers' tensors, which may be the old ones now: let them go (the next
        # forward reads anew; the graphs would also see the change by their sources)
        stack_plan.drop_plans(self)
        self._cuda_graphs = None
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args, **kwargs):
        # load_state_dict(assign=True) gives the layers new tensors: let the plan's old ones go now,
        # not at the next forward (in place, the plan would still be current; dropping costs one rebuild)
        stack_plan.drop_plans(self)
        self._cuda_graphs = None
        return super()._load_from_state_dict(*args, **kwargs)

    def cuda_graphs(self, enabled: bool = True, *, max_graphs: int = encoder.MAX_GRAPHS) -> "BertPreTrainedModel":
        """On CUDA, in inference, run the encoder (the embeddings through the last layer) as CUDA
        graphs: one replay a forward, each captured at the first batch of its bucket of (tokens,
        batch, longest sequence), at most max_graphs kept (fastbert.ops.encoder.EncoderGraphs, which
        says what memory they hold). The outputs are the eager forward's on the bucket's shapes. A
        forward that asks for what the graphs do not give (hidden states, attention probabilities,
        an additive mask, head_mask, inputs_embeds), training, int8 weights, CPU tensors or a
        backend other than Triton runs eagerly. enabled False: every forward eager. Returns self."""
        if enabled and (isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1):
            raise ValueError(f"fastbert: max_graphs must be an int >= 1, got {max_graphs!r}")
        base = self.base_model
        base.cuda_graph_limit = max_graphs if enabled else 0
        base._cuda_graphs = None
        return self

    def graphs_for(self, input_ids: Optional[torch.Tensor]) -> Optional[encoder.EncoderGraphs]:
        """The encoder's CUDA graphs when this forward runs in them (see cuda_graphs; the caller checks
        what the forward asks for), else None."""
        if (self.cuda_graph_limit <= 0 or input_ids is None or input_ids.device.type != "cuda" or self.training
                or self.quantized or not encoder.inference_now()):
            return None
        if fb_backend.resolve(self.embeddings.backend, input_ids) != "triton":
            return None
        if self._cuda_graphs is None:
            self._cuda_graphs = encoder.EncoderGraphs(self.packed_encode, self.cuda_graph_limit)
        return self._cuda_graphs

    def graph_sources(self) -> tuple:
        """What the CUDA graphs read by address: every parameter's and buffer's storage and dtype. A
        tensor replaced (not written in place) changes it, and the graphs are captured again."""
        return tuple((t.data_ptr(), t.dtype) for t in itertools.chain(self.parameters(), self.buffers()))

    def packed_encode(self, ids: torch.Tensor, types: torch.Tensor, positions: torch.Tensor,
                      cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """The encoder on packed tokens (ids, token types, positions [tokens]; cu_seqlens int32
        [batch + 1]) -> the last layer's rows [tokens, hidden]: what a CUDA graph captures. Each
        architecture's base model gives its own."""
        raise NotImplementedError(f"fastbert: {type(self).__name__} has no packed encoder for CUDA graphs")

    def _run_layer(self, layer, *args):
        """layer(*args) (an encoder layer or one of its methods), or checkpointed: its activations
        recomputed in the backward (training only)."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(layer, *args, **getattr(self, "checkpoint_kwargs", {}))
        return layer(*args)

    def quantize_(self, mode: str = "int8", *, weight_range: Optional[int] = None) -> "BertPreTrainedModel":
        """Quantize the encoder's linear layers in place for inference: "int8" (per-channel int8
        weights, per-token int8 activations, int32 accumulation; fastbert.model.quantize). weight_range:
        the weights' int8 range, 127 (None: the default) or 64, the same on every CPU; `quantization`
        then holds the settings, which save_pretrained records. Returns self."""
        chosen = quantize_model(self, mode, weight_range)
        for m in self.modules():
            if isinstance(m, BertPreTrainedModel):
                m.quantized, m.quantization = mode, dict(chosen)  # the wrapped BertModel of a task model too
        return self.eval()

    def train(self, mode: bool = True):
        patch_trainer_if_loaded(BertPreTrainedModel)  # transformers.Trainer calls train() before it trains and saves
        return super().train(mode)

    def post_init(self) -> None:
        if not _init_skipped[0]:
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
            if isinstance(m, BackendMixin):
                m.backend = backend
        return self

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    # ---- saving

    def save_pretrained(self, directory: str, state_dict: Optional[Dict[str, torch.Tensor]] = None,
                        safe_serialization: bool = True, is_main_process: bool = True,
                        max_shard_size=None, push_to_hub: bool = False) -> None:
        """config.json + model.safetensors (pytorch_model.bin when safe_serialization=False), as
        transformers writes them (tied copies left out); `state_dict` instead of the model's own (as
        Trainer passes it); nothing when not is_main_process. One file, whatever max_shard_size."""
        if push_to_hub:
            raise NotImplementedError("fastbert: save_pretrained writes a local directory; push it with huggingface_hub")
        if not is_main_process:
            return
        os.makedirs(directory, exist_ok=True)
        config = self.config.to_dict()
        config["architectures"] = [type(self).__name__]
        config["dtype"] = str(self.dtype).replace("torch.", "")
        config.pop("torch_dtype", None)
        config.pop(CONFIG_KEY, None)
        if self.quantization is not None:  # the dequantized weights, and how to quantize them again the same way
            config[CONFIG_KEY] = dict(self.quantization)
        type(self.config)(**config).save_pretrained(directory)
        state = self.state_dict() if state_dict is None else state_dict
        # copies: safetensors refuses tensors that share memory (the QKV projections are slices of one)
        state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()
                 if k not in self._tied_weights_keys}
        if self.checkpoint_format is not None:
            state = self.checkpoint_format.write(state)
        name = SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME
        tmp = os.path.join(directory, name + ".tmp")
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(state, tmp, metadata={"format": "pt"})
        else:
            torch.save(state, tmp)
        os.replace(tmp, os.path.join(directory, name))  # never a half-written checkpoint

    # ---- loading

    @classmethod
    def from_pretrained(cls, path: str, backend: Optional[str] = None, dtype=None, *, torch_dtype=None, quantize=None,
                        config=None, ignore_mismatched_sizes: bool = False, output_loading_info: bool = False,
                        device_map=None, **kwargs):
        """Load a transformers-format directory: config.json + model.safetensors or pytorch_model.bin.

        As transformers' from_pretrained: keyword arguments naming a config field override it
        (num_labels=5, hidden_dropout_prob=0.2, ...); `dtype` / `torch_dtype` (a torch.dtype, its
        name, or "auto" for the checkpoint's) casts the model; `config` replaces config.json;
        ignore_mismatched_sizes=True leaves weights of another shape (a new classifier) at their
        initial values; output_loading_info=True also returns the missing / unexpected / mismatched
        keys; device_map="cpu" / "cuda" moves the model; add_pooling_layer=False builds a base model
        without its pooler. The hub's own arguments (cache_dir,
        revision, ...) have no effect on a local directory and are accepted. Any other keyword is
        an error that names it. Old checkpoints (LayerNorm gamma/beta, position_ids buffers, with or
        without the "bert." prefix) load too. A checkpoint that lacks encoder weights, or holds encoder
        weights this architecture has no place for, is an error naming them; a new head's missing
        weights and another head's left-over ones are named in a warning. A directory saved from a
        quantized model (config.json's fastbert_quantization) loads quantized again with the settings
        it records, whether or not quantize="int8" is given (fastbert_quantization=None loads the
        dequantized weights as a float model).
        """
        check_quantize(quantize, f"{cls.__name__}.from_pretrained")
        init_kwargs = {}
        if "add_pooling_layer" in kwargs:  # an argument of the model's __init__, as transformers passes it
            if "add_pooling_layer" not in inspect.signature(cls.__init__).parameters:
                raise TypeError(f"fastbert: {cls.__name__}.from_pretrained() got an unexpected keyword argument "
                                "'add_pooling_layer' (only the base models take it)")
            init_kwargs["add_pooling_layer"] = bool(kwargs.pop("add_pooling_layer"))
        if not os.path.isdir(path):
            raise FileNotFoundError(f"fastbert: {path} is not a directory (expected config.json and model weights)")
        config = cls.config_class.from_pretrained(path) if config is None else cls.config_class(**config.to_dict())
        if CONFIG_KEY in kwargs:  # fastbert_quantization=None: a quantized model's directory loaded as floats
            setattr(config, CONFIG_KEY, kwargs.pop(CONFIG_KEY))
        apply_config_overrides(config, kwargs, f"{cls.__name__}.from_pretrained")
        saved = recorded(config, f"{cls.__name__}.from_pretrained")  # a quantized model's settings, checked first
        dtype = resolve_load_dtype(dtype, torch_dtype, config)
        with _without_init():  # every weight the checkpoint holds is about to be overwritten
            model = cls(config, **init_kwargs)
        state = load_state_dict(path)
        _, fit = match_state_dict(model.state_dict(), state, model.base_model_prefix, model._tied_weights_keys,
                                  model.checkpoint_format)
        if fit["missing_keys"] or fit["mismatched_keys"]:  # a new head: the random init it would have had
            model.post_init()
        dropped = ("pooler.",) if init_kwargs.get("add_pooling_layer") is False else ()  # asked for: not worth a warning
        info = model.load_transformers_state_dict(state, source=path, ignore_mismatched_sizes=ignore_mismatched_sizes,
                                                  unused_ok=dropped)
        if dtype is not None:
            model = model.to(dtype)
        if device_map is not None:
            if isinstance(device_map, dict):
                raise ValueError("fastbert: device_map must be one device (\"cpu\", \"cuda\", a torch.device), not a map")
            model = model.to(device_map)
        model.set_backend(backend)
        model.name_or_path = path
        model.eval()
        if quantize is not None or saved is not None:
            model.quantize_(quantize or saved["mode"], weight_range=saved["weight_range"] if saved else None)
        return (model, info) if output_loading_info else model

    def load_transformers_state_dict(self, state: Dict[str, torch.Tensor], source: str = "state dict",
                                     ignore_mismatched_sizes: bool = False, unused_ok=()) -> Dict[str, list]:
        """load_state_dict for checkpoints of any class of the family, old or new names. Encoder weights
        the checkpoint lacks or holds beyond this architecture are a ValueError naming them (nothing
        loaded); a head's missing or left-over keys (but those starting with one of unused_ok) are
        named in a warning. Returns them all (as transformers' loading info)."""
        own = self.state_dict()
        renamed, info = match_state_dict(own, state, self.base_model_prefix, self._tied_weights_keys,
                                         self.checkpoint_format)
        if info["mismatched_keys"] and not ignore_mismatched_sizes:
            bad = "; ".join(f"{k}: checkpoint {tuple(a)} vs model {tuple(b)}" for k, a, b in info["mismatched_keys"])
            raise ValueError(f"fastbert: {source} does not fit this config: {bad} "
                             "(from_pretrained(..., ignore_mismatched_sizes=True) leaves them at their initial values)")
        unexpected = [k for k in info["unexpected_keys"] if not k.startswith(tuple(unused_ok))]
        self._refuse_partial_encoder(info["missing_keys"], unexpected, source)
        self.load_state_dict(renamed, strict=False)
        missing = info["missing_keys"]
        if missing or unexpected or info["mismatched_keys"]:
            msg = f"fastbert: loading {type(self).__name__} from {source}:"
            if missing:
                msg += f"\n  missing (left at their initial values): {missing}"
            if info["mismatched_keys"]:
                msg += f"\n  of another shape (left at their initial values): {[k for k, _, _ in info['mismatched_keys']]}"
            if unexpected:
                msg += f"\n  unexpected (ignored): {unexpected}"
            warnings.warn(msg, stacklevel=3)
        return info

    def _refuse_partial_encoder(self, missing, unexpected, source: str) -> None:
        """ValueError naming the encoder's weights (the base model's, its pooler aside) that a
        checkpoint lacks or holds beyond this architecture: loading it would leave part of the encoder
        at random values or drop weights the checkpoint's model ran with (a variant fastbert does not
        run). A head that is new (missing) or not this class's (unexpected) is normal, as in transformers:
        that stays a warning."""
        base = self.base_model
        names = [name + "." for name, _ in base.named_children() if name != "pooler"]
        prefixes = tuple(names + ([self.base_model_prefix + "." + n for n in names] if base is not self else []))
        lacking = [k for k in missing if k.startswith(prefixes)]
        extra = [k for k in unexpected if k.startswith(prefixes)]
        if not lacking and not extra:
            return
        parts = []
        if lacking:
            parts.append(f"lacks encoder weights {_some(lacking)} (they would stay at random values)")
        if extra:
            parts.append(f"holds encoder weights {type(self).__name__} has no place for {_some(extra)} "
                         "(a variant of the architecture fastbert does not run, or another model's checkpoint)")
        raise ValueError(f"fastbert: {source} {' and '.join(parts)}; nothing was loaded")


_init_skipped = [False]


@contextlib.contextmanager
def _without_init() -> Iterator[None]:
    """Models built inside skip post_init's random init (their layers keep torch's own): from_pretrained
    builds the model it loads a checkpoint into this way, and runs the init only when the checkpoint
    leaves weights out. A 256k-token vocabulary's random init is slow, and it ran three times over
    (benchmarks/LOG.md, "Loading a 256k-token vocabulary")."""
    before = _init_skipped[0]
    _init_skipped[0] = True
    try:
        yield
    finally:
        _init_skipped[0] = before


def _some(keys, n: int = 6) -> str:
    shown = ", ".join(keys[:n])
    return f"[{shown}, ... {len(keys) - n} more]" if len(keys) > n else f"[{shown}]"
