"""The `fastbert` command."""
from __future__ import annotations

import sys

COMMANDS = {
    "selfcheck": ("fastbert.selfcheck", "check every fused op on every backend here against the fp64 reference"),
    "encode": ("fastbert.sentence", "embed lines of text with a sentence-transformers model (.npy out)"),
    "prepare": ("fastbert.data.prepare", "text files -> WordPiece vocabulary -> MLM + NSP sentence pairs on disk"),
    "pretrain": ("fastbert.pretraining.pretrain",
                 "pretrain BERT (MLM + NSP) on the fused ops; no arguments: the built-in demo"),
    "bench": ("fastbert.bench.encoder:quick", "time the encoder against transformers and the GEMM floor (about a minute)"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: fastbert COMMAND [options]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<12}{text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    import importlib

    module_name, _, function = COMMANDS[argv[0]][0].partition(":")
    module = importlib.import_module(module_name)
    return int(getattr(module, function or "main")(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
