"""`fastbert embed`: a whole corpus into Parquet embedding shards, streaming and resumable.

    fastbert embed MODEL_DIR --input PATH [PATH ...] --output DIR [--text-field text] [--id-field id]
                   [--output-dtype float32|int8|binary] [--quantize int8] [--prompt-name NAME]
                   [--shard-size 10000] [--batch-size 64] [--on-error fail|skip] [--overwrite] [--ray ADDRESS]

Three stages overlap (threads; tokenizing, the model and Parquet writing each release the GIL for
their work): a reader reads and tokenizes the next `shard_size` records while the model embeds the
current ones, longest first in batches (so each batch pads little), and a writer writes the last
shard. Memory holds a few shards' texts and embeddings, whatever the corpus size. Rows keep the
input's order. Killed at any moment, the same command continues after the last complete shard,
and the result is the same, row for row, as a run that was never stopped (bit for bit when both
processes run the same GEMM paths, which FASTBERT_GEMM pins; else within float rounding) (readers.py: records and
their positions; shards.py: the shards and the manifest). Run again once finished, with the same
settings, it succeeds and changes nothing (a scheduler's retry, a pipeline run again); with other
settings it is refused. --ray runs the same job on a Ray cluster (fastbert.ray).
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from typing import List, Optional

import numpy as np
import torch

from fastbert.corpus import readers, shards
from fastbert.memory import Trimmer

PROG = "fastbert embed"
_DONE = object()


def build_parser() -> argparse.ArgumentParser:
    from fastbert.cli import CommandParser

    p = CommandParser(prog=PROG, description="Embed a corpus (text, JSON Lines or Parquet files) into "
                                "Parquet shards with a sentence-transformers model; resumable.")
    p.add_argument("model", help="a sentence-transformers directory")
    p.add_argument("--input", "-i", nargs="+", required=True,
                   help="text files (one text per line), JSON Lines (.jsonl) or Parquet (.parquet) files")
    p.add_argument("--output", "-o", required=True, help="the output directory (shards and manifest.json)")
    p.add_argument("--text-field", default="text", help="the text's field (JSON Lines) or column (Parquet)")
    p.add_argument("--id-field", default=None, help="the id's field or column (default: the record's position)")
    p.add_argument("--output-dtype", choices=shards.OUTPUT_DTYPES, default="float32")
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


def settings_of(args) -> dict:
    """What a resumed run must share with the run it continues."""
    inputs = [[os.path.abspath(p), os.path.getsize(p), int(os.path.getmtime(p))] for p in args.input]
    return {"model": os.path.abspath(args.model), "inputs": inputs, "text_field": args.text_field,
            "id_field": args.id_field, "output_dtype": args.output_dtype, "quantize": args.quantize,
            "prompt_name": args.prompt_name, "shard_size": args.shard_size}


def record_chunks(args, start: int, skipped: Optional[readers.Skipped]):
    """Lists of shard_size records from position `start`, with the skipped count since the last."""
    chunk: List[readers.Record] = []
    before = 0
    for record in readers.read_records(args.input, text_field=args.text_field, id_field=args.id_field,
                                       skipped=skipped, start=start):
        chunk.append(record)
        if len(chunk) == args.shard_size:
            total = skipped.total if skipped is not None else 0
            yield chunk, total - before
            chunk, before = [], total
    total = skipped.total if skipped is not None else 0
    yield chunk, total - before  # the last, maybe empty: the skipped records after the last shard


def _staged(produce, depth: int = 2):
    """Run the generator `produce` in a thread, `depth` items ahead; errors re-raised here."""
    q: queue.Queue = queue.Queue(maxsize=depth)

    def run():
        try:
            for item in produce:
                q.put(item)
            q.put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put(e)

    threading.Thread(target=run, daemon=True, name="fastbert-embed-reader").start()
    while True:
        item = q.get()
        if item is _DONE:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class _Writer:
    """Writes shards in a thread, one at a time, in order; errors surface at the next call."""

    def __init__(self, directory: str, manifest: dict, output_dtype: str):
        self.directory, self.manifest, self.output_dtype = directory, manifest, output_dtype
        self.q: queue.Queue = queue.Queue(maxsize=1)
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="fastbert-embed-writer")
        self.thread.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is _DONE:
                return
            if self.error is None:
                try:
                    ids, emb, first, nxt, skipped = item
                    shards.add_shard(self.directory, self.manifest, shards.columns(ids, emb, self.output_dtype),
                                     first_position=first, next_position=nxt, skipped=skipped)
                except BaseException as e:  # noqa: BLE001 - reported by put / close
                    self.error = e

    def put(self, item) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(item)

    def close(self) -> None:
        self.q.put(_DONE)
        self.thread.join()
        if self.error is not None:
            raise self.error


@torch.no_grad()
def embed_records(encoder, records: List[readers.Record], prompt: str, skip: int, batch_size: int, bar=None) -> np.ndarray:
    """Embeddings [len(records), dim] (float32, in the records' order), batches longest first."""
    ids = encoder.tokenize([prompt + r.text for r in records])
    out = np.empty((len(ids), encoder.dim), np.float32)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for s in range(0, len(order), batch_size):
        chunk = order[s:s + batch_size]
        out[chunk] = encoder.embed_ids([ids[i] for i in chunk], skip).float().cpu().numpy()
        if bar is not None:
            bar.update(len(chunk))
    return out


def run(args) -> dict:
    """Embed args.input into args.output (resuming a run there); returns the final manifest."""
    from fastbert.sentence import SentenceEncoder

    readers.check_inputs(args.input)
    if not os.path.isdir(args.model):
        raise FileNotFoundError(f"model directory {args.model} does not exist")
    if args.shard_size < 1 or args.batch_size < 1:
        raise ValueError("--shard-size and --batch-size must be >= 1")
    encoder = SentenceEncoder(args.model, quantize=args.quantize)
    encoder.model.eval()
    prompt, skip = encoder.prompt(args.prompt_name)
    manifest = shards.start(args.output, settings_of(args), overwrite=args.overwrite)
    if manifest["complete"]:
        return manifest  # the finished run: nothing to do, nothing rewritten
    begin = shards.next_position(manifest)
    total = readers.count_records(args.input)
    skipped = readers.Skipped() if args.on_error == "skip" else None
    bar = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=begin, unit=" text", desc="embed", dynamic_ncols=True, file=sys.stderr)
    writer = _Writer(args.output, manifest, args.output_dtype)
    trim = Trimmer()  # the heap's free pages back to the system now and then (fastbert.memory)
    try:
        for chunk, n_skipped in _staged(record_chunks(args, begin, skipped)):
            if chunk:
                emb = embed_records(encoder, chunk, prompt, skip, args.batch_size, bar)
                writer.put(([r.id for r in chunk], emb, chunk[0].position, chunk[-1].position + 1, n_skipped))
                trim()
            elif n_skipped:
                manifest["tail_skipped"] = n_skipped
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    manifest["skipped"] = sum(s["skipped"] for s in manifest["shards"]) + manifest.pop("tail_skipped", 0)
    if skipped is not None:
        manifest["skipped_examples"] = skipped.examples
    manifest["complete"] = True
    manifest["dim"] = encoder.dim
    shards.write_manifest(args.output, manifest)
    return manifest


def main(argv=None) -> int:
    from fastbert.cli import model_directory

    args = build_parser().parse_args(argv)
    model_directory(args.model)  # named before the inputs are read, here or on a cluster
    readers.check_inputs(args.input)
    done = shards.finished(args.output, settings_of(args), overwrite=args.overwrite)
    if done is not None:  # a retry or re-run of a command that finished: it succeeds and changes nothing
        print(f"{PROG}: {args.output} already holds the finished run ({done['rows']} rows); nothing to do "
              "(--overwrite starts over)", file=sys.stderr)
        return 0
    t0 = time.perf_counter()
    if args.ray is not None:
        from fastbert.ray import embed_files

        manifest = embed_files(args)
    else:
        manifest = run(args)
    took = time.perf_counter() - t0
    print(f"{PROG}: {manifest['rows']} rows in {len(manifest['shards'])} shard(s) -> {args.output} in {took:.1f} s "
          f"({manifest['rows'] / max(took, 1e-9):.0f} texts/s); skipped {manifest.get('skipped', 0)}", file=sys.stderr)
    return 0
