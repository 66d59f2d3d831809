"""`fastbert.ray`: sentence embeddings on a Ray cluster (the optional `ray` extra: pip install "ray[data]").

    import ray, fastbert.ray
    ds = ray.data.read_parquet("corpus/")                                    # any dataset with a text column
    out = fastbert.ray.embed_dataset(ds, "path/to/all-MiniLM-L6-v2", text_field="text", id_field="doc_id")
    out.write_parquet("embeddings/")                                          # columns id, embedding

    fastbert embed MODEL_DIR --input a.jsonl b.parquet --output DIR --ray local     # a cluster on this machine

embed_dataset maps the dataset's batches through a pool of actors, each holding one
SentenceEncoder (loaded once, by the actor's first call) and running torch on `threads_per_actor`
threads; the output keeps the input's order (Ray Data's preserve_order) and has the columns of
`fastbert embed`'s shards (fastbert.corpus_embedding.shards.columns): id, embedding (fixed-size list of
float32, or int8 with a float32 scale, or the signs packed 8 to a byte), so the vectors are those of
the single process.

The pool's size (concurrency) defaults to as many actors as the nodes hold (a node of C CPUs holds
C // threads_per_actor), each claiming threads_per_actor CPUs from Ray. Ray starts a pool's actors
before the dataset's read tasks and an actor never frees what it claims, so on a dataset still to
be read (read_parquet, read_json, read_text, or any map before the embedding) such a pool would
leave the reads no CPU and wait forever. There the actors claim less: together all but one CPU of
each node (two actors of 0.5 CPU on a 2-CPU machine, one of no CPU on a 1-CPU machine), so a read
task always finds a CPU; each actor still runs threads_per_actor torch threads, which share the
cores with the reads while these last and have every core once they end. A materialized dataset
(from_items, from_arrow, ds.materialize(), as `fastbert embed --ray` hands over) has no reads: its
actors claim their threads' CPUs. An explicit concurrency (an int, or a (min, max) pair for Ray
Data's autoscaling pool) is kept, its actors' claims cut the same way, with a warning, where they
would take the reads' last CPU.

`fastbert embed ... --ray ADDRESS` (embed_files) writes the same output directory as the single
process (part-NNNNN.parquet shards and manifest.json, read alike by
fastbert.corpus_embedding.shards.read_embeddings), resumes the same way, and gives the same ids in the same
order: the driver reads the inputs with fastbert.corpus_embedding.readers (positions, ids, validation, skipped
records), hands the texts to the cluster a window of shards at a time (ray.data.from_arrow, blocks
sized so every actor has work), keeps the ids itself, and writes each shard once its rows are back.
Memory on the driver holds one window's texts and embeddings, whatever the corpus size; the actors
are started again for each window (a model load per actor every `window` rows).

ADDRESS: "local" starts a Ray cluster on this machine (or uses the one this process already
started); "auto" joins the cluster this machine belongs to; "ray://HOST:10001" connects a client to
a remote cluster's head. Across machines:

    head$    ray start --head --port 6379                    # also serves clients on ray://HEAD:10001
    worker$  ray start --address HEAD:6379                   # on every other machine
    head$    fastbert embed /shared/models/all-MiniLM-L6-v2 --input /shared/corpus/part-*.jsonl \\
                 --output /shared/embeddings --ray auto          # or from elsewhere: --ray ray://HEAD:10001

The model directory must be on a path every node sees (a shared file system, or the same copy at the
same path on each); the inputs are read and the shards written by the driver, where the command runs.
Every node needs fastbert installed (the same version) with the same torch.
"""
from __future__ import annotations

import logging
import math
import os
import warnings
from typing import List, NamedTuple, Optional

import numpy as np

from fastbert.corpus_embedding import job, readers, shards
from fastbert.memory import Trimmer

WHERE = "fastbert.ray"
ROWS_PER_CALL = 32  # model batches per actor call: the rows sorted longest first together


class Embedder:
    """One actor of the pool: a SentenceEncoder loaded once; batches in, shard columns out.

    The model is loaded by the first call, not by the constructor: Ray Data runs an actor's
    constructor in its main thread and its calls in a thread of their own, and torch's OpenMP
    (libgomp) keeps a pool of threads for each thread that starts parallel work. With two pools on
    the actor's cores every region pays a wake-up (fastbert.serve.batching says more): an actor of
    2 threads encoded slower when the constructor had loaded the model than when its first call had
    (benchmarks/LOG.md, "fastbert.ray: the model loaded in the thread of the actor's calls")."""

    def __init__(self, model_dir: str, text_field: str, id_field: str, batch_size: int, threads: int,
                 quantize: Optional[str], prompt_name: Optional[str], output_dtype: str, outputs=job.DENSE):
        self.model_dir, self.threads, self.quantize, self.prompt_name = model_dir, threads, quantize, prompt_name
        self.text_field, self.id_field = text_field, id_field
        self.batch_size, self.output_dtype, self.outputs = batch_size, output_dtype, tuple(outputs)
        self.encoder = None
        self.trim = Trimmer()  # the heap's free pages back to the system now and then (fastbert.memory)

    def _load(self) -> None:
        import torch

        from fastbert.sentence import SentenceEncoder, run_task

        torch.set_num_threads(self.threads)
        self.encoder = SentenceEncoder(self.model_dir, quantize=self.quantize,
                                       task=run_task(self.model_dir, self.prompt_name))
        self.encoder.model.eval()
        self.prompt, self.skip = self.encoder.prompt(self.prompt_name)

    def __call__(self, batch):
        import pyarrow as pa

        if self.encoder is None:
            self._load()
        texts = batch.column(self.text_field).to_pylist()
        ids = batch.column(self.id_field).to_pylist()
        records = []
        for ident, text in zip(ids, texts):
            if not isinstance(text, str) or not text.strip():
                what = "empty" if isinstance(text, str) else f"{type(text).__name__}, not a string"
                raise ValueError(f"{WHERE}: the text of id {ident!r} is {what}")
            records.append(readers.Record(ident, text, 0))
        out = (job.embed_records(self.encoder, records, self.prompt, self.skip, self.batch_size, None, self.outputs)
               if records else {name: np.zeros((0, self.encoder.dim), np.float32) if name == "dense" else []
                                for name in self.outputs})
        cols = shards.columns(ids, out, self.output_dtype)
        cols["id"] = batch.column(self.id_field)  # the ids as given, their type kept
        self.trim()
        return pa.table(cols)


def node_cpus() -> List[int]:
    """The CPUs of each live node of the cluster."""
    import ray

    return [int(node["Resources"].get("CPU", 0)) for node in ray.nodes() if node.get("Alive")]


def actors_that_fit(threads: int) -> int:
    """How many actors of `threads` CPUs the cluster's nodes hold."""
    return sum(cpus // threads for cpus in node_cpus())


class Pool(NamedTuple):
    """The actor pool map_batches gets: its sizes and the CPUs each actor claims from Ray."""

    min_size: int
    max_size: int
    cpus_per_actor: float

    def strategy(self):
        import ray

        if self.min_size == self.max_size:
            # one call at a time an actor: with two in flight, the first actor up takes two of a small
            # dataset's few calls while another waits idle (an autoscaling pool needs two to grow)
            return ray.data.ActorPoolStrategy(size=self.min_size, max_tasks_in_flight_per_actor=1)
        return ray.data.ActorPoolStrategy(min_size=self.min_size, max_size=self.max_size)


def _sizes(concurrency) -> tuple:
    """(min, max) of an explicit concurrency: an int (a fixed pool) or a (min, max) pair."""
    if isinstance(concurrency, (tuple, list)) and len(concurrency) == 2:
        low, high = (int(c) for c in concurrency)
    elif isinstance(concurrency, (int, np.integer)) and not isinstance(concurrency, bool):
        low = high = int(concurrency)
    else:
        raise ValueError(f"{WHERE}: concurrency must be an int or a (min, max) pair, got {concurrency!r}")
    if not 1 <= low <= high:
        raise ValueError(f"{WHERE}: concurrency needs 1 <= min <= max, got {concurrency!r}")
    return low, high


def pool_for(ds, concurrency, threads: int) -> Pool:
    """The actor pool for embedding `ds`, one that never holds the CPU its read tasks wait for (the
    module's docstring says why): for a dataset still to be read, the actors together claim at most
    all but one CPU of each node, so by pigeonhole some node always has a whole CPU free for a read
    task (Ray Data's read and map tasks claim one each); a warning where an explicit concurrency's
    claims are cut."""
    from ray.data.dataset import MaterializedDataset

    nodes = node_cpus()
    fit = max(1, sum(cpus // threads for cpus in nodes))
    low, high = (fit, fit) if concurrency is None else _sizes(concurrency)
    if isinstance(ds, MaterializedDataset) or not any(nodes):  # nothing to read, or no CPU yet to leave
        return Pool(low, high, threads)
    spare = sum(max(0, cpus - 1) for cpus in nodes)
    claim = min(threads, math.floor(spare / high * 10_000) / 10_000)  # Ray counts CPUs in steps of 1e-4
    if concurrency is not None and claim < threads:
        warnings.warn(f"{WHERE}: concurrency={concurrency!r} at {threads} CPU(s) an actor would hold every CPU the "
                      f"dataset's read tasks wait for, and Ray never frees one: each actor claims {claim:g} CPU(s) "
                      f"instead (and still runs {threads} thread(s))", stacklevel=3)
    return Pool(low, high, claim)


def check_prompt(model_dir: str, prompt_name: Optional[str]) -> None:
    """A prompt_name the model does not have: an error here, before any actor starts."""
    if prompt_name is None:
        return
    from fastbert.sentence import read_json

    path = os.path.join(model_dir, "config_sentence_transformers.json")
    prompts = (read_json(path, "config_sentence_transformers.json").get("prompts") or {}) if os.path.isfile(path) else {}
    if prompt_name not in prompts:
        raise ValueError(f"{WHERE}: prompt_name {prompt_name!r} is not one of this model's prompts {sorted(prompts)}")


def embed_dataset(ds, model_dir: str, *, text_field: str = "text", id_field: Optional[str] = None,
                  batch_size: int = 64, concurrency: Optional[int] = None, threads_per_actor: Optional[int] = None,
                  quantize: Optional[str] = None, prompt_name: Optional[str] = None, output_dtype: str = "float32",
                  rows_per_call: Optional[int] = None, outputs=job.DENSE):
    """A Ray Dataset of the columns id and embedding (and scale for output_dtype="int8") of `ds`'s
    rows, in their order; outputs: ("dense",) by default, and with BGE-M3's heads "sparse"
    (sparse_indices, sparse_values) and "colbert" (fastbert.corpus_embedding.shards' columns).
    id_field: the column holding the ids (None: the column "id"; a dataset without one is refused,
    as Ray Data numbers no rows: add one, or embed files with embed_files, which numbers records by
    position). concurrency: the actors, an int or a (min, max) pair (default: as many as the nodes
    hold, each claiming threads_per_actor CPUs, except on a dataset still to be read, where together
    they claim all but one CPU of each node: a pool holding every CPU would leave the read tasks
    waiting forever; the module's docstring says more); threads_per_actor: torch threads in each
    (default 1); rows_per_call: rows handed to an actor at a time, embedded longest first in batches
    of batch_size (default 32 batches)."""
    import ray

    if output_dtype not in shards.OUTPUT_DTYPES:
        raise ValueError(f"{WHERE}: output_dtype must be one of {', '.join(shards.OUTPUT_DTYPES)}, got {output_dtype!r}")
    if batch_size < 1:
        raise ValueError(f"{WHERE}: batch_size must be >= 1, got {batch_size}")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"{WHERE}: model directory {model_dir} does not exist")
    check_prompt(model_dir, prompt_name)
    job.check_outputs(tuple(outputs), model_dir, f"{WHERE}: outputs")
    names = ds.columns() if hasattr(ds, "columns") else ds.schema().names
    id_column = id_field if id_field is not None else "id"
    for column, what in ((text_field, "text_field"), (id_column, "id_field")):
        if column not in names:
            hint = "" if what == "text_field" or id_field is not None else (
                "; Ray Data numbers no rows: add an id column and name it with id_field, or embed files with "
                "fastbert.ray.embed_files (`fastbert embed --ray`), which uses each record's position")
            raise ValueError(f"{WHERE}: the dataset has no column {column!r} ({what}; columns: {names}){hint}")
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    threads = int(threads_per_actor or 1)
    pool = pool_for(ds, concurrency, threads)
    ds.context.execution_options.preserve_order = True
    return ds.map_batches(
        Embedder, batch_format="pyarrow", batch_size=rows_per_call or ROWS_PER_CALL * batch_size,
        compute=pool.strategy(), num_cpus=pool.cpus_per_actor,
        fn_constructor_kwargs=dict(model_dir=os.path.abspath(model_dir), text_field=text_field, id_field=id_column,
                                   batch_size=batch_size, threads=threads, quantize=quantize,
                                   prompt_name=prompt_name, output_dtype=output_dtype, outputs=tuple(outputs)))


def connect(address: str, progress: bool = True) -> bool:
    """Join or start the cluster `address` names; True when this call started it (and must stop it)."""
    import ray
    import ray.data  # noqa: F401 - its loggers configured before they are set below

    logging.getLogger("ray").setLevel(logging.INFO if progress else logging.WARNING)
    logging.getLogger("ray.data").setLevel(logging.INFO if progress else logging.WARNING)
    if ray.is_initialized():
        return False
    kwargs = dict(include_dashboard=False, log_to_driver=progress, logging_level=logging.INFO if progress
                  else logging.WARNING)
    if address == "local":
        ray.init(**kwargs)
    else:
        ray.init(address=address, **kwargs)
    return True


def _unwrap(error: BaseException) -> BaseException:
    """The exception raised in an actor, out of the Ray errors that carry it."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "cause", None) or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    return error


def _windows(run: job.Run, window: int):
    """Lists of (records, skipped since the last) of at most `window` shards each."""
    group = []
    for chunk, n_skipped in run.chunks():
        group.append((chunk, n_skipped))
        if len(group) == window:
            yield group
            group = []
    if group:
        yield group


def _embed_window(records: List[readers.Record], args, actors: int, threads: int):
    """The records' outputs (job.embed_records', float32), in their order, from the cluster, a part
    at a time as they come."""
    import pyarrow as pa
    import ray

    per = max(1, min(ROWS_PER_CALL * args.batch_size, math.ceil(len(records) / (4 * actors))))
    blocks = [pa.table({"pos": pa.array(range(s, min(s + per, len(records))), pa.int64()),
                        "text": [r.text for r in records[s:s + per]]}) for s in range(0, len(records), per)]
    ds = ray.data.from_arrow(blocks)
    out = embed_dataset(ds, args.model, text_field="text", id_field="pos", batch_size=args.batch_size,
                        concurrency=actors, threads_per_actor=threads, quantize=args.quantize,
                        prompt_name=args.prompt_name, output_dtype="float32", rows_per_call=per,
                        outputs=job.outputs_of(args))
    at = 0
    for batch in out.iter_batches(batch_format="pyarrow", batch_size=None):
        pos = batch.column("id").to_numpy()
        if len(pos) and (pos[0] != at or pos[-1] != at + len(pos) - 1):
            raise RuntimeError(f"{WHERE}: rows came back out of order (position {pos[0]}, expected {at})")
        yield shards.outputs_of(batch, job.outputs_of(args))
        at += len(pos)
    if at != len(records):
        raise RuntimeError(f"{WHERE}: {at} rows came back of {len(records)}")


def _write_window(run: job.Run, group, parts) -> Optional[int]:
    """Each shard of the window written as soon as its rows are back; the embeddings' width (None:
    no rows in this window, or no dense output)."""
    pending, have, dim = [], 0, None
    for chunk, n_skipped in group:
        if not chunk:
            run.skipped_after_last(n_skipped)
            continue
        while have < len(chunk):
            part = next(parts)
            pending.append(part)
            have += job.rows_of(part)
        out = job.concat(pending)
        if "dense" in out:
            dim = out["dense"].shape[1]
        run.add_shard([r.id for r in chunk], job.take(out, 0, len(chunk)), chunk[0].position,
                      chunk[-1].position + 1, n_skipped)
        rest = job.take(out, len(chunk))
        pending, have = ([rest] if job.rows_of(rest) else []), job.rows_of(rest)
    return dim


def _settings(args, actors: int, threads: int) -> dict:
    return {"address": args.ray, "actors": actors, "threads_per_actor": threads}


def embed_files(args) -> dict:
    """`fastbert embed ... --ray ADDRESS`: args as `fastbert embed`'s parser gives them
    (fastbert.commands.embed; plus, optionally, ray_actors, ray_threads and ray_window: actors, torch
    threads per actor, shards per window; the environment variables FASTBERT_RAY_ACTORS and
    FASTBERT_RAY_THREADS set the first two for the command line); writes args.output as the single
    process does (the job of fastbert.corpus_embedding.job) and returns the final manifest."""
    job.check(args)
    check_prompt(args.model, args.prompt_name)
    run = job.start(args)
    if run.done:
        return run.manifest  # the finished run: nothing to do, nothing rewritten, no cluster started
    progress = not args.no_progress
    started = connect(args.ray, progress)
    try:
        import ray

        ray.data.DataContext.get_current().enable_progress_bars = progress
        threads = int(getattr(args, "ray_threads", None) or os.environ.get("FASTBERT_RAY_THREADS") or 1)
        actors = int(getattr(args, "ray_actors", None) or os.environ.get("FASTBERT_RAY_ACTORS")
                     or max(1, actors_that_fit(threads)))
        window = int(getattr(args, "ray_window", None) or max(1, 100_000 // args.shard_size))
        run.manifest["ray"] = _settings(args, actors, threads)
        dim = None
        for group in _windows(run, window):
            records = [r for chunk, _ in group for r in chunk]
            try:
                got = _write_window(run, group, _embed_window(records, args, actors, threads))
            except Exception as e:  # noqa: BLE001 - the actor's own error, not Ray's wrapping of it
                raise _unwrap(e) from None
            dim = got or dim
    finally:
        if started:
            ray.shutdown()
    return run.finish(dim if dim is not None else _dim(args.model))


def _dim(model_dir: str) -> int:
    """The model's embedding width (for the manifest of a run that embedded nothing here)."""
    from fastbert.sentence import SentenceEncoder

    return SentenceEncoder(model_dir).dim
