"""Dynamic batching: one model worker and a queue of jobs, one job per request.

The worker takes the jobs waiting, in arrival order, until their real tokens fill the budget
(max_batch_tokens; at least one job), sorts their rows longest first and runs them in batches of at
most that many real tokens (the model runs unpadded, so real tokens are what a batch costs). Each
job's rows come back in its own order, as one numpy array, and its future is resolved on the event
loop as soon as its last row has run: one copy a job and one wake-up of the loop for all the jobs a
batch ends (a torch op a row made the worker's time after a batch much longer:
benchmarks/LOG.md, "the server's worker after a batch"). A request waits for no company: whatever
arrives while a batch runs joins the next one, and a lone request runs at once.

At most max_concurrent_requests jobs are queued or running; one more is refused at once
(`Overloaded`, answered 429). A job whose client went away before its rows ran is dropped; a batch
that fails fails the jobs in it and no other.

The worker is a thread of the batcher's own, or (thread=False) whichever thread calls `work()`.
Every torch op of a request runs there, its `finish` (normalizing, scores) included, so that one
thread alone runs parallel regions: torch's OpenMP (libgomp) keeps a pool of threads for each thread
that starts one, and once the pools hold more threads than the machine has cores, every pool's
threads sleep between regions instead of spinning, which costs each region a wake-up (on 2 cores a
short MiniLM forward ran markedly slower in a second thread than in the one that loaded the model:
benchmarks/LOG.md, "fastbert serve: the model in the thread that loaded it"). The server runs the
model in the thread that loaded and warmed it (fastbert.commands.serve).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, List, Optional, Sequence

import numpy as np
import torch

from fastbert import token_outputs
from fastbert.memory import Trimmer


class Overloaded(RuntimeError):
    """The queue is full."""


@dataclass
class Job:
    rows: Sequence
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    finish: Optional[Callable[[np.ndarray], Any]] = None
    outputs: Optional[tuple] = None  # named outputs of the model's run (None: its one array)
    enqueued: float = field(default_factory=time.perf_counter)
    out: Any = None  # numpy [len(rows), ...], or with outputs {output: [each row's]}
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
        self.thread = None
        if thread:
            self.thread = threading.Thread(target=self.work, name="fastbert-model", daemon=True)
            self.thread.start()

    @property
    def in_flight(self) -> int:
        return len(self._jobs) + self._busy

    def submit(self, rows: Sequence, finish: Optional[Callable[[np.ndarray], Any]] = None,
               outputs: Optional[Sequence[str]] = None) -> asyncio.Future:
        """A future of the rows' outputs (numpy [len(rows), ...]), or of finish(outputs), run by the
        worker (call from the event loop). outputs: named outputs of the model's run instead
        (run(rows, outputs), for all the jobs of a batch at once), given as {output: [each row's,
        its tensors as numpy]}."""
        loop = asyncio.get_running_loop()
        job = Job(rows, loop.create_future(), loop, finish, None if outputs is None else tuple(outputs))
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
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

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
        trim = Trimmer()  # the heap's free pages back to the system now and then (fastbert.memory)
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
            trim()

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
            # the named outputs the batch's jobs ask for, made by one run (the plain jobs' array as "dense")
            named = sorted({o for j, _ in live for o in (j.outputs or ())})
            if named and any(j.outputs is None for j, _ in live) and "dense" not in named:
                named.append("dense")
            try:
                rows = [j.rows[i] for j, i in live]
                out = self.run(rows, tuple(named)) if named else self.run(rows)
            except Exception as exc:  # noqa: BLE001 - the jobs of this batch fail, the server goes on
                failed = list({id(j): j for j, _ in live}.values())
                for job in failed:
                    job.failed = True
                _answer([(job, exc, False) for job in failed])
                continue
            if self.metrics is not None:
                self.metrics.batch(len(live), sum(len(j.rows[i]) for j, i in live), time.perf_counter() - t0)
            if named:
                plain = [(j, i) for j, i in live if j.outputs is None]
                done = _scatter(plain, out["dense"][[k for k, (j, _) in enumerate(live) if j.outputs is None]]) \
                    if plain else []
                done += _scatter_named([(k, j, i) for k, (j, i) in enumerate(live) if j.outputs is not None], out)
            else:
                done = _scatter(live, out)
            _answer([_finish(job) for job in done])

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_size.set(self.in_flight)


def _scatter(live: List[tuple], out: torch.Tensor) -> List[Job]:
    """Each job's rows of the batch's outputs into job.out (numpy, one array a job, its rows in its
    own order); returns the jobs whose last row this was. One copy a job, not a torch op a row."""
    values = token_outputs.on_cpu(out, numpy=True)  # (no copy when it is on the CPU already)
    rows: dict = {}  # id(job) -> (job, its row indices, their places in the batch)
    for k, (job, i) in enumerate(live):
        entry = rows.get(id(job))
        if entry is None:
            entry = rows[id(job)] = (job, [], [])
        entry[1].append(i)
        entry[2].append(k)
    done = []
    for job, indices, places in rows.values():
        if job.out is None and len(indices) == len(job.rows):  # the whole job in this batch: one gather
            order = [0] * len(indices)
            for i, k in zip(indices, places):
                order[i] = k
            job.out = values[order]
        else:
            if job.out is None:
                job.out = np.empty((len(job.rows), *values.shape[1:]), dtype=values.dtype)
            job.out[indices] = values[places]
        job.left -= len(indices)
        if job.left == 0:
            done.append(job)
    return done


def _scatter_named(live: List[tuple], out: dict) -> List[Job]:
    """Each job's rows of the batch's named outputs ((place in the batch, job, row index) each) into
    job.out, {output: [each row's, numpy]}; returns the jobs whose last row this was."""
    done = []
    for k, job, i in live:
        if job.out is None:
            job.out = {name: [None] * len(job.rows) for name in job.outputs}
        for name in job.outputs:
            job.out[name][i] = token_outputs.on_cpu(out[name][k], numpy=True)
        job.left -= 1
        if job.left == 0:
            done.append(job)
    return done


def _finish(job: Job) -> tuple:
    """(job, its outputs or job.finish(outputs), True), or (job, the error of its finish, False):
    a finish that fails fails its job alone."""
    try:
        return job, (job.out if job.finish is None else job.finish(job.out)), True
    except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
        return job, exc, False


def _answer(answers: List[tuple]) -> None:
    """Resolve the jobs' futures on their event loop: one wake-up of each loop for the whole batch."""
    loops: dict = {}
    for answer in answers:
        loops.setdefault(answer[0].loop, []).append(answer)
    for loop, some in loops.items():
        loop.call_soon_threadsafe(_resolve, some)


def _resolve(answers: List[tuple]) -> None:
    for job, value, ok in answers:
        if job.future.done():  # its client went away
            continue
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)
