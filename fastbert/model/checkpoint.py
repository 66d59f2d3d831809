"""Checkpoint files in transformers' format: reading model.safetensors / pytorch_model.bin and
the key names older checkpoints used."""
from __future__ import annotations

import os
import re
from typing import Dict, NamedTuple, Optional, Tuple

import torch

SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME = "pytorch_model.bin"


def normalise_keys(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.endswith("position_ids") or k.endswith("embeddings.token_type_ids"):
            continue  # buffers older checkpoints saved
        if "LayerNorm" in k or "layer_norm" in k:
            k = k.replace(".gamma", ".weight").replace(".beta", ".bias")
        out[k] = v
    return out


class KeyFormat(NamedTuple):
    """How a family's checkpoint files name its weights where the names differ from its modules'
    (GTE's files keep the original model's names, and transformers writes them so too): renames
    (the file's part of a key, the model's), joins (the file's part of a key whose tensor is the
    model's parts concatenated along dim 0, in order: a joined QKV projection) and old prefixes (a
    file prefix read as the model's base prefix), read-only renames (names some files use, read
    but never written: a parametrized weight's "parametrizations.weight.original"). read() takes
    either naming; write() gives the files'."""

    renames: Tuple[Tuple[str, str], ...] = ()
    joins: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    old_prefixes: Tuple[str, ...] = ()
    read_renames: Tuple[Tuple[str, str], ...] = ()

    @staticmethod
    def _sub(key: str, old: str, new: str) -> str:
        """key with `old` replaced by `new` where it starts the key or a dotted part of it."""
        return re.sub(r"(^|\.)" + re.escape(old), lambda m: m.group(1) + new, key)

    @staticmethod
    def _has(key: str, part: str) -> bool:
        return re.search(r"(^|\.)" + re.escape(part), key) is not None

    def read(self, state: Dict[str, torch.Tensor], base_prefix: str) -> Dict[str, torch.Tensor]:
        """The file's tensors under the model's names (keys already so named pass as they are)."""
        out = {}
        for key, value in state.items():
            for old in self.old_prefixes:
                if key.startswith(old + "."):
                    key = base_prefix + key[len(old):]
            for old, new in self.renames + self.read_renames:
                key = self._sub(key, old, new)
            for joined, parts in self.joins:
                if self._has(key, joined):
                    for part, chunk in zip(parts, value.chunk(len(parts), dim=0)):
                        out[self._sub(key, joined, part)] = chunk
                    break
            else:
                out[key] = value
        return out

    def write(self, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The model's tensors under the files' names, each join's parts concatenated."""
        out = dict(state)
        for joined, parts in self.joins:
            for key in [k for k in out if self._has(k, parts[0])]:
                names = [self._sub(key, parts[0], part) for part in parts]
                if all(n in out for n in names):
                    out[self._sub(key, parts[0], joined)] = torch.cat([out.pop(n) for n in names])
        renamed = {}
        for key, value in out.items():
            for old, new in self.renames:
                key = self._sub(key, new, old)
            renamed[key] = value
        return renamed


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


def match_state_dict(own: Dict[str, torch.Tensor], state: Dict[str, torch.Tensor], base_prefix: str,
                     tied: Dict[str, str], key_format: Optional[KeyFormat] = None):
    """(the checkpoint's tensors under the model's names, loading info). Handles old key names, the
    family's file names (key_format), a BertModel checkpoint into a model with heads and the
    reverse, and tied keys the checkpoint left out; loading info: missing_keys, unexpected_keys,
    mismatched_keys (name, checkpoint shape, model shape), error_msgs, as transformers reports them."""
    state = normalise_keys(state)
    if key_format is not None:
        state = key_format.read(state, base_prefix)
    prefix = base_prefix + "."
    has_prefix = any(k.startswith(prefix) for k in own)
    renamed = {}
    for k, v in state.items():
        if has_prefix and not k.startswith(prefix) and prefix + k in own:
            k = prefix + k  # a BertModel checkpoint into a model with heads
        elif not has_prefix and k.startswith(prefix):
            k = k[len(prefix):]  # a checkpoint with heads into a BertModel
        renamed[k] = v
    for dst, src in tied.items():
        if dst not in renamed and src in renamed:
            renamed[dst] = renamed[src]
    mismatched = [(k, tuple(renamed[k].shape), tuple(own[k].shape))
                  for k in own if k in renamed and renamed[k].shape != own[k].shape]
    bad = {k for k, _, _ in mismatched}
    info = {
        "missing_keys": sorted(k for k in own if k not in renamed),
        "unexpected_keys": sorted(k for k in renamed if k not in own),
        "mismatched_keys": mismatched,
        "error_msgs": [],
    }
    return {k: v for k, v in renamed.items() if k in own and k not in bad}, info


# transformers' from_pretrained arguments that concern the hub or its loading machinery: they have no
# effect on a local directory
HUB_KWARGS = frozenset({
    "cache_dir", "force_download", "local_files_only", "revision", "token", "use_auth_token", "trust_remote_code",
    "use_safetensors", "low_cpu_mem_usage", "subfolder", "proxies", "resume_download", "mirror", "variant",
    "_fast_init", "attn_implementation", "from_tf", "from_flax", "offload_folder", "offload_state_dict",
})


def apply_config_overrides(config, kwargs: Dict[str, object], where: str) -> None:
    """Set the config fields named in `kwargs` (as transformers does for its from_pretrained);
    a keyword that is neither a config field nor a hub argument is a TypeError naming it."""
    for key, value in kwargs.items():
        if key in HUB_KWARGS:
            continue
        if key == "num_labels":
            config.num_labels = int(value)
        elif key == "id2label":
            config.id2label = {int(k): v for k, v in value.items()}
        elif key == "label2id":
            config.id2label = {int(i): name for name, i in value.items()}
        elif hasattr(config, key) or key in config.known_fields():
            setattr(config, key, value)
        else:
            raise TypeError(f"fastbert: {where}() got an unexpected keyword argument {key!r} "
                            "(neither a BertConfig field nor a from_pretrained argument)")
    config.validate()


def resolve_load_dtype(dtype, torch_dtype, config) -> Optional[torch.dtype]:
    """The dtype a loaded model is cast to: `dtype` or its older name `torch_dtype` (a dtype, a name,
    or "auto": the one the checkpoint's config names), None to keep float32."""
    from fastbert.dtypes import parse_dtype

    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise ValueError(f"fastbert: dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; pass one of them")
    value = dtype if dtype is not None else torch_dtype
    if value is None:
        return None
    if value == "auto":
        saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        return parse_dtype(saved) if saved else None
    return parse_dtype(value)
