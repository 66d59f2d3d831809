"""`fastbert rerank`: lines of text ranked against a query with a cross-encoder (fastbert.CrossEncoder), JSON lines out."""
from __future__ import annotations

import json

from fastbert.commands import CommandParser, input_file, model_directory, read_lines
from fastbert.cross_encoder import CrossEncoder


def main(argv=None) -> int:
    ap = CommandParser(prog="fastbert rerank", description="Rank lines of text against a query with a cross-encoder.")
    ap.add_argument("model", help="a CrossEncoder directory (config.json, weights, tokenizer.json)")
    ap.add_argument("--query", "-q", required=True)
    ap.add_argument("--input", "-i", default="-", help="a text file, one document per line ('-': standard input)")
    ap.add_argument("--top-k", type=int, default=None, help="print the best K (default: all)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--backend", default=None, choices=["triton", "cpp", "torch"])
    ap.add_argument("--quantize", default=None, choices=["int8"])
    args = ap.parse_args(argv)
    model_directory(args.model)  # named before the input is read or the model loaded
    docs = read_lines(input_file(args.input))
    ce = CrossEncoder(args.model, backend=args.backend, quantize=args.quantize)
    for r in ce.rank(args.query, docs, top_k=args.top_k, return_documents=True, batch_size=args.batch_size,
                     show_progress_bar=True):
        print(json.dumps(r, ensure_ascii=False))
    return 0
