"""The `fastbert` command."""
from __future__ import annotations

import os
import sys

COMMANDS = {
    "selfcheck": ("fastbert.selfcheck", "check every fused op on every backend here against the fp64 reference"),
    "encode": ("fastbert.sentence", "embed lines of text with a sentence-transformers model (.npy out)"),
    "rerank": ("fastbert.cross_encoder", "rank lines of text against a query with a cross-encoder (JSON lines out)"),
    "prepare": ("fastbert.data.prepare", "text files -> WordPiece vocabulary -> MLM + NSP sentence pairs on disk"),
    "pretrain": ("fastbert.pretraining.pretrain",
                 "pretrain BERT (MLM + NSP) on the fused ops; no arguments: the built-in demo"),
    "serve": ("fastbert.serve", "serve embeddings, reranking or classification over HTTP (text-embeddings-inference's "
                                "and OpenAI's routes, dynamic batching; needs the serve extra)"),
    "attention-map": ("fastbert.maps", "draw what each layer and head attends to in a text (PNG)"),
    "bench": ("fastbert.bench.encoder:quick",
              "time the encoder against transformers and the GEMM floor (about a minute); --peers adds "
              "ONNX Runtime, OpenVINO, CTranslate2 and torch.compile; --quantize int8 times int8 inference"),
}


def _usage(out) -> None:
    print("usage: fastbert COMMAND [options]\n\ncommands:", file=out)
    for name, (_, text) in COMMANDS.items():
        print(f"  {name:<12}{text}", file=out)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def main(argv=None) -> int:
    """Run a subcommand. Every error is one line on stderr and a non-zero exit: 2 for usage errors
    (argparse's), 1 for anything that fails while running (FASTBERT_DEBUG=1 shows the traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _usage(sys.stdout)
        return 0
    if argv[0] not in COMMANDS:
        _usage(sys.stderr)
        print(f"fastbert: error: unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    import importlib

    name = argv[0]
    module_name, _, function = COMMANDS[name][0].partition(":")
    try:
        module = importlib.import_module(module_name)
        return int(getattr(module, function or "main")(argv[1:]) or 0)
    except KeyboardInterrupt:
        print(f"fastbert {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command line reports, the traceback is opt-in
        if os.environ.get("FASTBERT_DEBUG") == "1":
            raise
        print(f"fastbert {name}: error: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
