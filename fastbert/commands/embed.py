"""`fastbert embed`: a whole corpus into Parquet embedding shards, streaming and resumable.

    fastbert embed MODEL_DIR --input PATH [PATH ...] --output DIR [--text-field text] [--id-field id]
                   [--output-dtype float32|int8|binary] [--outputs dense,sparse,colbert] [--quantize int8]
                   [--prompt-name NAME]
                   [--shard-size 10000] [--batch-size 64] [--on-error fail|skip] [--overwrite] [--ray ADDRESS]

The job (what is computed and written, how a killed run resumes): fastbert.corpus_embedding.job; run in this
process by fastbert.corpus_embedding.local, or with --ray on a Ray cluster by fastbert.ray. Run again once
finished, with the same settings, it succeeds and changes nothing (a scheduler's retry, a pipeline
run again); with other settings it is refused.
"""
from __future__ import annotations

import argparse
import sys
import time

from fastbert.commands import CommandParser, model_directory
from fastbert.corpus_embedding import job, readers, shards

PROG = "fastbert embed"


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog=PROG, description="Embed a corpus (text, JSON Lines or Parquet files) into "
                                "Parquet shards with a sentence-transformers model; resumable.")
    p.add_argument("model", help="a sentence-transformers directory")
    p.add_argument("--input", "-i", nargs="+", required=True,
                   help="text files (one text per line), JSON Lines (.jsonl) or Parquet (.parquet) files")
    p.add_argument("--output", "-o", required=True, help="the output directory (shards and manifest.json)")
    p.add_argument("--text-field", default="text", help="the text's field (JSON Lines) or column (Parquet)")
    p.add_argument("--id-field", default=None, help="the id's field or column (default: the record's position)")
    p.add_argument("--output-dtype", choices=shards.OUTPUT_DTYPES, default="float32")
    p.add_argument("--outputs", type=lambda v: tuple(x.strip() for x in v.split(",") if x.strip()), default=("dense",),
                   help="what to write, comma-separated: dense (the embedding), and with BGE-M3's heads sparse "
                        "(sparse_indices, sparse_values) and colbert (each text's vectors); default dense")
    p.add_argument("--quantize", choices=["int8"], default=None, help="run the model's linear layers in int8")
    p.add_argument("--prompt-name", default=None, help="one of the model's prompts (e5: query, passage)")
    p.add_argument("--shard-size", type=int, default=10000, help="rows per shard (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="texts per model batch (default %(default)s)")
    p.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="a bad record: stop with an error naming it (default), or skip and count it")
    p.add_argument("--overwrite", action="store_true", help="start over in an --output that holds a run")
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run on a Ray cluster ('auto', 'local' or ray://host:port): needs the ray extra")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    model_directory(args.model)  # named before the inputs are read, here or on a cluster
    readers.check_inputs(args.input)
    done = job.finished(args)
    if done is not None:  # a retry or re-run of a command that finished: it succeeds and changes nothing
        print(f"{PROG}: {args.output} already holds the finished run ({done['rows']} rows); nothing to do "
              "(--overwrite starts over)", file=sys.stderr)
        return 0
    t0 = time.perf_counter()
    if args.ray is not None:
        from fastbert.ray import embed_files

        manifest = embed_files(args)
    else:
        from fastbert.corpus_embedding.local import run

        manifest = run(args)
    took = time.perf_counter() - t0
    print(f"{PROG}: {manifest['rows']} rows in {len(manifest['shards'])} shard(s) -> {args.output} in {took:.1f} s "
          f"({manifest['rows'] / max(took, 1e-9):.0f} texts/s); skipped {manifest.get('skipped', 0)}", file=sys.stderr)
    return 0
