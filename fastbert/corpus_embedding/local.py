"""The embed job (fastbert.corpus_embedding.job) run in this process: `fastbert embed` without --ray.

Three stages overlap (threads; tokenizing, the model and Parquet writing each release the GIL for
their work): a reader reads and tokenizes the next `shard_size` records while the model embeds the
current ones, longest first in batches, and a writer writes the last shard. Memory holds a few
shards' texts and embeddings, whatever the corpus size. Rows keep the input's order.
"""
from __future__ import annotations

import queue
import sys
import threading
from typing import Optional

from fastbert.corpus_embedding import job, readers
from fastbert.memory import Trimmer

_DONE = object()


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

    def __init__(self, run: job.Run):
        self.run = run
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
                    self.run.add_shard(*item)
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


def run(args) -> dict:
    """Embed args.input into args.output (resuming a run there); returns the final manifest."""
    from fastbert.sentence import SentenceEncoder, run_task

    job.check(args)
    encoder = SentenceEncoder(args.model, quantize=args.quantize, task=run_task(args.model, args.prompt_name))
    encoder.model.eval()
    prompt, skip = encoder.prompt(args.prompt_name)
    this = job.start(args)
    if this.done:
        return this.manifest  # the finished run: nothing to do, nothing rewritten
    total = readers.count_records(args.input)
    bar = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=this.begin, unit=" text", desc="embed",
                   dynamic_ncols=True, file=sys.stderr)
    writer = _Writer(this)
    trim = Trimmer()  # the heap's free pages back to the system now and then (fastbert.memory)
    try:
        for chunk, n_skipped in _staged(this.chunks()):
            if chunk:
                out = job.embed_records(encoder, chunk, prompt, skip, args.batch_size, bar, job.outputs_of(args))
                writer.put(([r.id for r in chunk], out, chunk[0].position, chunk[-1].position + 1, n_skipped))
                trim()
            else:
                this.skipped_after_last(n_skipped)
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    return this.finish(encoder.dim)
