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

import argparse
import os
import sys
from typing import List, Optional, Tuple

import torch


def _encode(tokenizer, text: str) -> Tuple[List[int], List[str]]:
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


def _select(probs: torch.Tensor, layer: Optional[int], head: Optional[int]) -> torch.Tensor:
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
    ids, _ = _encode(tokenizer, text)
    bert = getattr(model, "base_model", model)
    was_training = bert.training
    bert.eval()
    try:
        with torch.no_grad():
            out = bert(torch.tensor([ids], device=bert.device), output_attentions=True)
    finally:
        bert.train(was_training)
    probs = torch.stack([a[0] for a in out.attentions]).float().cpu()
    return _select(probs, layer, head)


def draw(probs: torch.Tensor, tokens: List[str], path: str, layers: List[int], heads: List[int]) -> None:
    """A grid of maps (probs [len(layers), len(heads), tokens, tokens]) labelled with the tokens, to `path`."""
    from fastbert.plotting import pyplot, text_fonts

    plt = pyplot(what="no attention map drawn")
    if plt is None:
        raise RuntimeError("drawing needs matplotlib: pip install matplotlib")
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


def _load_tokenizer(path: str):
    file = os.path.join(path, "tokenizer.json")
    if os.path.isfile(file):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(file)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise FileNotFoundError(f"{path} has no tokenizer.json (and transformers is not installed)") from None
    return AutoTokenizer.from_pretrained(path)


def main(argv=None) -> int:
    from fastbert.cli import CommandParser, model_directory

    ap = CommandParser(prog="fastbert attention-map", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a BERT directory in transformers' format, with its tokenizer")
    ap.add_argument("--text", required=True)
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--layer", type=int, default=None, help="draw this layer only (default: every layer)")
    ap.add_argument("--head", type=int, default=None, help="draw this head only (default: every head)")
    args = ap.parse_args(argv)
    model_directory(args.model)  # named before the model package is imported
    from fastbert.model import BertModel

    model = BertModel.from_pretrained(args.model)
    tokenizer = _load_tokenizer(args.model)
    probs = attention_map(model, tokenizer, args.text)
    _select(probs, args.layer, args.head)  # a bad layer / head is an error before anything is drawn
    layers = list(range(probs.shape[0])) if args.layer is None else [args.layer]
    heads = list(range(probs.shape[1])) if args.head is None else [args.head]
    _, tokens = _encode(tokenizer, args.text)
    draw(probs[layers][:, heads], tokens, args.output, layers, heads)
    print(f"wrote {args.output}: {len(layers)} layer(s) x {len(heads)} head(s), {len(tokens)} tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from fastbert.cli import main as cli_main

    sys.exit(cli_main(["attention-map", *sys.argv[1:]]))
