"""`fastbert attention-map`: a layer x head grid of what each head attends to in a text, labelled
with the tokens, as a PNG (fastbert.attention_maps)."""
from __future__ import annotations

import argparse
import os
import sys

from fastbert import attention_maps
from fastbert.commands import CommandParser, model_directory


def load_tokenizer(path: str):
    """The model directory's tokenizer: its tokenizer.json, else transformers' AutoTokenizer."""
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
    ap = CommandParser(prog="fastbert attention-map", description=attention_maps.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a BERT directory in transformers' format, with its tokenizer")
    ap.add_argument("--text", required=True)
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--layer", type=int, default=None, help="draw this layer only (default: every layer)")
    ap.add_argument("--head", type=int, default=None, help="draw this head only (default: every head)")
    args = ap.parse_args(argv)
    model_directory(args.model)  # named before the model package is imported
    from fastbert.model import BertModel

    model = BertModel.from_pretrained(args.model)
    tokenizer = load_tokenizer(args.model)
    probs = attention_maps.attention_map(model, tokenizer, args.text)
    attention_maps.select(probs, args.layer, args.head)  # a bad layer / head is an error before anything is drawn
    layers = list(range(probs.shape[0])) if args.layer is None else [args.layer]
    heads = list(range(probs.shape[1])) if args.head is None else [args.head]
    _, tokens = attention_maps.encode_text(tokenizer, args.text)
    attention_maps.draw(probs[layers][:, heads], tokens, args.output, layers, heads)
    print(f"wrote {args.output}: {len(layers)} layer(s) x {len(heads)} head(s), {len(tokens)} tokens", file=sys.stderr)
    return 0
