"""Dynamic batching: one model worker and a queue of jobs, one job per request.

The worker takes the jobs waiting, in arrival order, until their real tokens fill the budget
(max_batch_tokens; at least one job), sorts their rows longest first and runs them in batches of at
most that many real tokens (the model runs unpadded, so real tokens are what a batch costs). Each
job's rows come back in its own order, and its future is resolved on the event loop as soon as its
last row has run. A request waits for no company: whatever arrives while a batch runs joins the
next one, and a lone request runs at once.

At most max_concurrent_requests jobs are queued or running; one more is refused at once
(`Overloaded`, answered 429). A job whose client went away before its rows ran is dropped; a batch
that fails fails the jobs in it and no other.

The worker is a thread of the batcher's own, or (thread=False) whichever thread calls `work()`.
Every torch op of a request runs there, its `finish` (normalizing, scores) included, so that one
thread alone runs parallel regions: torch's OpenMP (libgomp) keeps a pool of threads for each thread
that starts one, and once the pools hold more threads than the machine has cores, every pool's
threads sleep between regions instead of spinning, which costs each region a wake-up (a 20-token
MiniLM forward took 5.6 ms in a second thread against 3.5 in the one that loaded the model, on 2
cores). The server runs the model in the thread that loaded and warmed it (fastbert.serve.main).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, List, Optional, Sequence

import torch


class Overloaded(RuntimeError):
    """The queue is full."""


@dataclass
class Job:
    rows: Sequence
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    finish: Optional[Callable[[torch.Tensor], Any]] = None
    enqueued: float = field(default_factory=time.perf_counter)
    out: Optional[torch.Tensor] = None
    left: int = 0
    failed: bool = False

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self.rows)

    @property
    def abandoned(self) -> bool:
        return self.future.done()


class Batcher:
    def __init__(self, run: Callable[[List], torch.Tensor], *, max_batch_tokens: int, max_concurrent_requests: int,
                 metrics=None, thread: bool = True):
        self.run = run
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_concurrent_requests = int(max_concurrent_requests)
        self.metrics = metrics
        self._jobs: Deque[Job] = deque()
        self._busy = 0  # jobs taken by the worker and not finished
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = None
        if thread:
            self._thread = threading.Thread(target=self.work, name="fastbert-model", daemon=True)
            self._thread.start()

    @property
    def in_flight(self) -> int:
        return len(self._jobs) + self._busy

    def submit(self, rows: Sequence, finish: Optional[Callable[[torch.Tensor], Any]] = None) -> asyncio.Future:
        """A future of the rows' outputs [len(rows), ...], or of finish(outputs), run by the worker
        (call from the event loop)."""
        loop = asyncio.get_running_loop()
        job = Job(rows, loop.create_future(), loop, finish)
        with self._cv:
            if self._stopping:
                raise Overloaded("the server is shutting down")
            if self.in_flight >= self.max_concurrent_requests:
                raise Overloaded(f"{self.in_flight} requests are queued or running (--max-concurrent-requests "
                                 f"{self.max_concurrent_requests})")
            self._jobs.append(job)
            self._gauge()
            self._cv.notify()
        return job.future

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the jobs taken, then stop the worker (and wait for the batcher's own thread)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- the worker

    def _take(self) -> List[Job]:
        with self._cv:
            while not self._jobs and not self._stopping:
                self._cv.wait()
            taken: List[Job] = []
            tokens = 0
            while self._jobs and (not taken or tokens + self._jobs[0].tokens <= self.max_batch_tokens):
                job = self._jobs.popleft()
                tokens += job.tokens
                taken.append(job)
            self._busy += len(taken)
            return taken

    def work(self) -> None:
        """Run batches until stop(): the worker's loop (the batcher's own thread runs it, or the
        caller with thread=False)."""
        while True:
            jobs = self._take()
            if not jobs:
                return  # stopping, nothing left
            try:
                self._run_jobs([j for j in jobs if not j.abandoned])
            finally:
                with self._cv:
                    self._busy -= len(jobs)
                    self._gauge()

    def _batches(self, jobs: List[Job]):
        """Lists of (job, row index), longest rows first, each at most max_batch_tokens real tokens."""
        rows = sorted(((j, i) for j in jobs for i in range(len(j.rows))), key=lambda ji: -len(ji[0].rows[ji[1]]))
        batch, tokens = [], 0
        for job, i in rows:
            n = len(job.rows[i])
            if batch and tokens + n > self.max_batch_tokens:
                yield batch
                batch, tokens = [], 0
            batch.append((job, i))
            tokens += n
        if batch:
            yield batch

    def _run_jobs(self, jobs: List[Job]) -> None:
        start = time.perf_counter()
        for job in jobs:
            job.left = len(job.rows)
            if self.metrics is not None:
                self.metrics.queue_duration.observe(start - job.enqueued)
        for batch in self._batches(jobs):
            live = [(j, i) for j, i in batch if not j.failed]
            if not live:
                continue
            t0 = time.perf_counter()
            try:
                out = self.run([j.rows[i] for j, i in live])
            except Exception as exc:  # noqa: BLE001 - the jobs of this batch fail, the server goes on
                for job in {id(j): j for j, _ in live}.values():
                    job.failed = True
                    job.loop.call_soon_threadsafe(_fail, job.future, exc)
                continue
            if self.metrics is not None:
                self.metrics.batch(len(live), sum(len(j.rows[i]) for j, i in live), time.perf_counter() - t0)
            for (job, i), value in zip(live, out):
                if job.out is None:
                    job.out = torch.empty((len(job.rows), *value.shape), dtype=value.dtype)
                job.out[i] = value
                job.left -= 1
                if job.left == 0:
                    _finish(job)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_size.set(self.in_flight)


def _finish(job: Job) -> None:
    """Resolve the job's future with its outputs, or with job.finish(outputs) (its error fails the
    job alone)."""
    try:
        value = job.out if job.finish is None else job.finish(job.out)
    except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
        job.loop.call_soon_threadsafe(_fail, job.future, exc)
        return
    job.loop.call_soon_threadsafe(_resolve, job.future, value)


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
