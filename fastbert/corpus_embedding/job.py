"""The embed job: a corpus into Parquet embedding shards, resumable, whichever runner runs it.

What a run computes and writes: each record's embedding by the model's SentenceEncoder, in the
input's order, in shards of `shard_size` rows (shards.py: the shards and the manifest; readers.py:
records and their positions). Killed at any moment, the same job continues after the last
complete shard, and the result is the same, row for row, as a run that was never stopped (bit for
bit when both processes run the same GEMM paths, which FASTBERT_GEMM pins; else within float
rounding). Run again once finished, with the same settings, it changes nothing; with other
settings it is refused.

The runners share this module's prologue and epilogue and differ only in where the model runs:

    check(args)                  inputs, model directory and sizes, before anything is loaded
    run = start(args)            the output's manifest begun or resumed (run.done: nothing left)
    run.chunks()                 the records still to embed, shard_size at a time
    run.add_shard(...)           one shard written and listed in the manifest
    run.finish(dim)              the totals, and the manifest marked complete

fastbert.corpus_embedding.local runs the model in this process; fastbert.ray on a Ray cluster. `args` holds
what `fastbert embed` parses (fastbert.commands.embed): model, input, output, text_field,
id_field, output_dtype, outputs, quantize, prompt_name, shard_size, batch_size, on_error, overwrite.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from fastbert import token_outputs
from fastbert.corpus_embedding import readers, shards

DENSE = ("dense",)


def outputs_of(args) -> tuple:
    """The outputs a run writes (--outputs; "dense" alone by default)."""
    return tuple(getattr(args, "outputs", None) or DENSE)


def settings_of(args) -> dict:
    """What a resumed run must share with the run it continues."""
    inputs = [[os.path.abspath(p), os.path.getsize(p), int(os.path.getmtime(p))] for p in args.input]
    settings = {"model": os.path.abspath(args.model), "inputs": inputs, "text_field": args.text_field,
                "id_field": args.id_field, "output_dtype": args.output_dtype, "quantize": args.quantize,
                "prompt_name": args.prompt_name, "shard_size": args.shard_size}
    if outputs_of(args) != DENSE:  # (a run of the dense output alone keeps the settings it always had)
        settings["outputs"] = list(outputs_of(args))
    return settings


def finished(args) -> Optional[dict]:
    """The manifest of the finished run args.output holds with these settings, or None (shards.finished;
    OutputError for a run with other settings). Reads only."""
    return shards.finished(args.output, settings_of(args), overwrite=args.overwrite)


def check(args) -> None:
    """The inputs, the model directory and the sizes: errors naming them, before a model is loaded
    or the output touched."""
    readers.check_inputs(args.input)
    if not os.path.isdir(args.model):
        raise FileNotFoundError(f"model directory {args.model} does not exist")
    if args.shard_size < 1 or args.batch_size < 1:
        raise ValueError("--shard-size and --batch-size must be >= 1")
    check_outputs(outputs_of(args), args.model, "--outputs")


def check_outputs(outputs: Sequence[str], model_dir: str, name: str) -> None:
    """An error naming what is wrong with the outputs asked of the model in model_dir: an unknown
    one, or one whose head (BGE-M3's) the model does not ship."""
    unknown = [o for o in outputs if o not in shards.OUTPUTS]
    if unknown or not outputs:
        raise ValueError(f"{name} takes {', '.join(shards.OUTPUTS)} (comma-separated), got {','.join(outputs)}")
    given = token_outputs.outputs_in(model_dir)
    missing = [o for o in outputs if o not in given]
    if missing:
        raise ValueError(f"{name} {','.join(missing)}: {token_outputs.lacking(missing, given)}")


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


@torch.no_grad()
def embed_records(encoder, records: List[readers.Record], prompt: str, skip: int, batch_size: int, bar=None,
                  outputs: Sequence[str] = DENSE) -> Dict[str, object]:
    """{output: its values, in the records' order}: "dense", embeddings [len(records), dim] float32;
    "sparse", each record's (token ids, weights); "colbert", each record's vectors (numpy); batches
    longest first (so each batch pads little)."""
    ids = encoder.tokenize([prompt + r.text for r in records])
    out: Dict[str, object] = {name: [None] * len(ids) for name in outputs if name != "dense"}
    if "dense" in outputs:
        out["dense"] = np.empty((len(ids), encoder.dim), np.float32)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for s in range(0, len(order), batch_size):
        chunk = order[s:s + batch_size]
        got = encoder.outputs_of_ids([ids[i] for i in chunk], skip, outputs)
        for name, value in got.items():
            if name == "dense":
                out["dense"][chunk] = value.float().cpu().numpy()
                continue
            for i, item in zip(chunk, value):
                out[name][i] = token_outputs.on_cpu(item, numpy=True)
        if bar is not None:
            bar.update(len(chunk))
    return out


def rows_of(outputs: Dict[str, object]) -> int:
    """How many texts' outputs `outputs` holds."""
    return len(next(iter(outputs.values())))


def take(outputs: Dict[str, object], start: int, stop: Optional[int] = None) -> Dict[str, object]:
    """The outputs of texts start..stop."""
    return {name: value[start:stop] for name, value in outputs.items()}


def concat(parts: List[Dict[str, object]]) -> Dict[str, object]:
    """The outputs of consecutive texts joined, in order."""
    if len(parts) == 1:
        return parts[0]
    return {name: (np.concatenate([p[name] for p in parts]) if name == "dense" else [x for p in parts for x in p[name]])
            for name in parts[0]}


class Run:
    """One run of the job in args.output: the manifest it continues, the position it starts at, the
    skipped records counted (with --on-error skip)."""

    def __init__(self, args, manifest: dict):
        self.args, self.manifest = args, manifest
        self.done = bool(manifest["complete"])
        self.begin = shards.next_position(manifest)
        self.skipped = readers.Skipped() if args.on_error == "skip" else None
        self.tail_skipped = 0  # the skipped records after the last shard

    def chunks(self):
        """(records, skipped since the last) of shard_size records from where the run stands; the last
        list may be empty (then only its count is news: hand it to skipped_after_last)."""
        return record_chunks(self.args, self.begin, self.skipped)

    def skipped_after_last(self, count: int) -> None:
        self.tail_skipped += count

    def add_shard(self, ids: List, outputs: Dict[str, object], first_position: int, next_position: int,
                  skipped: int) -> None:
        """The next shard (ids and their outputs, embed_records') written in the output dtype and listed."""
        shards.add_shard(self.args.output, self.manifest, shards.columns(ids, outputs, self.args.output_dtype),
                         first_position=first_position, next_position=next_position, skipped=skipped)

    def finish(self, dim: int) -> dict:
        """The epilogue: the skipped records counted, the manifest marked complete and written; returns it."""
        manifest = self.manifest
        manifest["skipped"] = sum(s["skipped"] for s in manifest["shards"]) + self.tail_skipped
        if self.skipped is not None:
            manifest["skipped_examples"] = self.skipped.examples
        manifest["complete"] = True
        manifest["dim"] = dim
        shards.write_manifest(self.args.output, manifest)
        return manifest


def start(args) -> Run:
    """The prologue's last step: the output's manifest begun, or resumed when it holds a run with the
    same settings (its unfinished files removed); run.done when that run is finished (nothing is
    written or removed then); OutputError when its settings differ (unless args.overwrite)."""
    return Run(args, shards.start(args.output, settings_of(args), overwrite=args.overwrite))
