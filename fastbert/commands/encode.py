"""`fastbert encode`: lines of text embedded with a sentence-transformers model (fastbert.SentenceEncoder), .npy out."""
from __future__ import annotations

import os
import sys

import numpy as np

from fastbert.commands import CommandParser, input_file, model_directory, read_lines
from fastbert.sentence import SentenceEncoder, run_task


def main(argv=None) -> int:
    ap = CommandParser(prog="fastbert encode", description="Embed lines of text with a sentence-transformers model.")
    ap.add_argument("model", help="a sentence-transformers directory "
                    "(modules.json, config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--input", "-i", default="-", help="a text file, one sentence per line ('-': standard input)")
    ap.add_argument("--output", "-o", required=True, help="where to write the embeddings (.npy, float32 [lines, dim])")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--backend", default=None, choices=["triton", "cpp", "torch"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--quantize", default=None, choices=["int8"],
                    help="int8: int8 weights and activations in the encoder's linear layers (fastbert.model.quantize)")
    ap.add_argument("--prompt-name", default=None, help="one of the model's prompts (e5: query, passage; "
                    "jina-embeddings-v3: a task, whose adapters run too)")
    args = ap.parse_args(argv)
    model_directory(args.model)  # named before the input is read or the model loaded
    lines = read_lines(input_file(args.input))
    enc = SentenceEncoder(args.model, backend=args.backend, device=args.device, quantize=args.quantize,
                          task=run_task(args.model, args.prompt_name))  # a prompt named after a task: folded in
    emb = (enc.encode(lines, batch_size=args.batch_size, prompt_name=args.prompt_name, show_progress_bar=True)
           if lines else np.zeros((0, enc.dim), np.float32))
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.output + ".tmp.npy"
    np.save(tmp, emb.astype(np.float32))
    os.replace(tmp, args.output)  # a complete file or none
    print(f"wrote {emb.shape[0]} x {emb.shape[1] if emb.ndim == 2 else 0} embeddings to {args.output}", file=sys.stderr)
    return 0
