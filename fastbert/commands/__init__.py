"""The `fastbert` command line: one module per command, above everything it calls (no library
module imports this package); fastbert.cli, the console entry point, dispatches to them.

    selfcheck.py  encode.py  rerank.py  prepare.py  pretrain.py  embed.py  serve.py  attention_map.py  bench.py

Each command module has `main(argv) -> exit status`. Every error a command reports is one line on
stderr, `fastbert <command>: error: <message>`, and a non-zero exit: 2 for usage errors
(CommandParser, the parser every command uses) and for the input errors a command returns 2 for,
1 for anything else that fails while running (FASTBERT_DEBUG=1 shows the traceback). `report`
writes that line, and only it.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List

PROG = "fastbert"
# name -> (the module whose main(argv) runs it, the line `fastbert --help` shows)
COMMANDS = {
    "selfcheck": ("fastbert.commands.selfcheck",
                  "check every fused op on every backend here against the fp64 reference"),
    "encode": ("fastbert.commands.encode", "embed lines of text with a sentence-transformers model (.npy out)"),
    "rerank": ("fastbert.commands.rerank",
               "rank lines of text against a query with a cross-encoder (JSON lines out)"),
    "prepare": ("fastbert.commands.prepare",
                "text files -> vocabulary -> pretraining data on disk (BERT's MLM + NSP pairs, "
                "or XLM-R's MLM sequences with --model-type xlm-roberta)"),
    "pretrain": ("fastbert.commands.pretrain",
                 "pretrain BERT (MLM + NSP) or XLM-R (MLM) on the fused ops; no arguments: the built-in demo"),
    "embed": ("fastbert.commands.embed", "embed a corpus (text, JSON Lines, Parquet) into Parquet shards; resumable, "
                                         "--ray for a cluster"),
    "serve": ("fastbert.commands.serve", "serve embeddings, reranking or classification over HTTP "
                                         "(text-embeddings-inference's and OpenAI's routes, dynamic batching; needs "
                                         "the serve extra)"),
    "attention-map": ("fastbert.commands.attention_map", "draw what each layer and head attends to in a text (PNG)"),
    "bench": ("fastbert.commands.bench",
              "time the encoder against transformers and the GEMM floor (about a minute); --peers adds "
              "ONNX Runtime, OpenVINO, CTranslate2 and torch.compile; --quantize int8 times int8 inference"),
}
# what messages carry in front of their text that the error line already says: "error: ", and where
# they come from ("fastbert: ", "fastbert prepare: ", "fastbert.SentenceEncoder.encode: ")
PREFIX = re.compile(r"^(?:error:\s*|fastbert(?:\.[\w.]+| (?:" + "|".join(map(re.escape, COMMANDS)) + r"))?:\s+)+")


def message(error) -> str:
    """The first line of an exception's (or a string's) text, without a leading "error: " or
    "fastbert...: "; an exception with no text: its class name."""
    lines = str(error).strip().splitlines()
    text = PREFIX.sub("", lines[0]).strip() if lines else ""
    return text or (type(error).__name__ if isinstance(error, BaseException) else "error")


def report(prog: str, error) -> None:
    """The one line a command's error is: `<prog>: error: <message>` on stderr (prog: "fastbert
    <command>", or "fastbert" for the command line itself)."""
    print(f"{prog}: error: {message(error)}", file=sys.stderr, flush=True)


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, with a usage error as one line on stderr (no usage block) and exit 2;
    --help prints the full help, as argparse's."""

    def error(self, text: str):
        report(self.prog, text)
        self.exit(2)


def model_directory(path: str) -> str:
    """path, when it is a directory; else FileNotFoundError naming it as the model directory."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"model directory {path} does not exist")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory {path} is not a directory")
    return path


def input_file(path: str, what: str = "input file") -> str:
    """path ('-': standard input), when it is a file; else FileNotFoundError naming it."""
    if path != "-" and not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path} " + ("is a directory" if os.path.isdir(path) else "does not exist"))
    return path


def read_lines(path: str) -> List[str]:
    """The lines of a UTF-8 text file ('-': standard input), without their line ends."""
    if path == "-":
        return [ln.rstrip("\n") for ln in sys.stdin]
    with open(path, encoding="utf-8") as f:
        return [ln.rstrip("\n") for ln in f]
