"""Attention maps: what each head of each layer attends to, for one text.

    probs = fastbert.attention_map(model, tokenizer, "the cat sat on the mat")   # [layers, heads, tokens, tokens]
    probs = fastbert.attention_map(model, tokenizer, text, layer=3)              # [heads, tokens, tokens]
    probs = fastbert.attention_map(model, tokenizer, text, layer=3, head=7)      # [tokens, tokens]

    fastbert attention-map --model DIR --text "..." -o map.png [--layer L] [--head H]

Row i of a map is token i's attention over the tokens (each row sums to 1), the values
transformers' eager attention returns (output_attentions); the model runs in eval mode. The
picture is a grid, a row per layer and a column per head, each map labelled with the tokens.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch


def encode_text(tokenizer, text: str) -> Tuple[List[int], List[str]]:
    """(ids, token strings) of `text` with the special tokens, from a transformers tokenizer or a
    `tokenizers.Tokenizer`."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("fastbert.attention_map: text must be a non-empty string")
    if hasattr(tokenizer, "convert_ids_to_tokens"):  # transformers
        ids = tokenizer(text, truncation=True)["input_ids"]
        return list(ids), tokenizer.convert_ids_to_tokens(ids)
    enc = tokenizer.encode(text)  # a tokenizer.json may pad: keep the real tokens
    real = [i for i, m in enumerate(enc.attention_mask) if m]
    return [enc.ids[i] for i in real], [enc.tokens[i] for i in real]


def select(probs: torch.Tensor, layer: Optional[int], head: Optional[int]) -> torch.Tensor:
    """probs [layers, heads, tokens, tokens] narrowed to one layer and / or head; a ValueError naming
    one the model does not have."""
    layers, heads = probs.shape[:2]
    for name, value, n in (("layer", layer, layers), ("head", head, heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n):
            raise ValueError(f"fastbert.attention_map: {name} must be an int in [0, {n}) (the model has {n} {name}s), "
                             f"got {value!r}")
    if layer is not None:
        probs = probs[layer]
        return probs if head is None else probs[head]
    return probs if head is None else probs[:, head]


def attention_map(model, tokenizer, text: str, layer: Optional[int] = None, head: Optional[int] = None) -> torch.Tensor:
    """The attention probabilities of `text`: float32 [layers, heads, tokens, tokens] on the CPU;
    `layer` and / or `head` select one (see the module docstring)."""
    ids, _ = encode_text(tokenizer, text)
    bert = getattr(model, "base_model", model)
    was_training = bert.training
    bert.eval()
    try:
        with torch.no_grad():
            out = bert(torch.tensor([ids], device=bert.device), output_attentions=True)
    finally:
        bert.train(was_training)
    probs = torch.stack([a[0] for a in out.attentions]).float().cpu()
    return select(probs, layer, head)


def draw(probs: torch.Tensor, tokens: List[str], path: str, layers: List[int], heads: List[int]) -> None:
    """A grid of maps (probs [len(layers), len(heads), tokens, tokens]) labelled with the tokens, to `path`."""
    from fastbert.plotting import missing, pyplot, text_fonts

    plt = pyplot(quiet=True)
    if plt is None:  # the map is what was asked for: an error, in the one line that says how to draw it
        raise RuntimeError(missing(os.path.basename(path)))
    with text_fonts(tokens):  # Hangul tokens drawn in a font that has them
        _draw_grid(plt, probs, tokens, path, layers, heads)


def _draw_grid(plt, probs, tokens, path, layers, heads) -> None:
    n = len(tokens)
    size = max(1.6, min(4.0, 0.22 * n))
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(size * len(heads) + 1, size * len(layers) + 0.5),
                             squeeze=False)
    labels = n <= 40  # past that the labels overlap; the maps stay readable
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(probs[r, c].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer} head {head}", fontsize=7)
            ax.set_xticks(range(n) if labels else [])
            ax.set_yticks(range(n) if labels else [])
            if labels:
                ax.set_xticklabels(tokens, rotation=90, fontsize=5)
                ax.set_yticklabels(tokens, fontsize=5)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)

