"""The batcher without HTTP: with thread=False every torch op of a request (the model's run and the
request's finish) runs in the thread that calls work(), the one that loaded the model in `fastbert
serve`; a finish that fails fails its own request alone; jobs come back in their own order."""
import asyncio
import threading

import numpy as np
import pytest
import torch

from fastbert.serve.batching import Batcher


def test_work_runs_every_batch_and_finish_in_the_calling_thread():
    threads = set()

    def run(rows):
        threads.add(("run", threading.get_ident()))
        return torch.tensor([[float(sum(r))] for r in rows])

    def finish(out):
        threads.add(("finish", threading.get_ident()))
        return out[:, 0].tolist()

    def bad_finish(out):
        raise ValueError("this request's own failure")

    batcher = Batcher(run, max_batch_tokens=4, max_concurrent_requests=16, thread=False)

    async def requests():
        jobs = [batcher.submit([[1, 2], [3], [4, 5, 6]], finish), batcher.submit([[7]]),
                batcher.submit([[1]], bad_finish), batcher.submit([[2, 2], [9]], finish)]
        done = await asyncio.gather(*jobs, return_exceptions=True)
        batcher.stop()
        return done

    answers = []
    client = threading.Thread(target=lambda: answers.extend(asyncio.run(requests())))
    client.start()
    batcher.work()  # returns once the client's stop() comes
    client.join()
    assert answers[0] == [3.0, 3.0, 15.0] and answers[3] == [4.0, 9.0]
    assert answers[1].tolist() == [[7.0]]
    assert isinstance(answers[2], ValueError) and "own failure" in str(answers[2])
    assert threads == {("run", threading.get_ident()), ("finish", threading.get_ident())}


def test_own_thread_by_default():
    seen = []
    batcher = Batcher(lambda rows: seen.append(threading.get_ident()) or torch.zeros(len(rows), 1),
                      max_batch_tokens=8, max_concurrent_requests=4)

    async def one():
        return await batcher.submit([[1, 2]])

    assert asyncio.run(one()).shape == (1, 1)
    batcher.stop()
    assert seen and seen[0] != threading.get_ident()
    with pytest.raises(Exception, match="shutting down"):
        asyncio.run(one())


def test_outputs_come_back_as_numpy_in_each_jobs_order_bf16_as_float32():
    """A batch's outputs go back as one numpy array a job, its rows in its own order (the batch runs
    them longest first), bf16 read as float32 (numpy has no bf16)."""
    def run(rows):
        return torch.tensor([[float(len(r)), float(r[0])] for r in rows], dtype=torch.bfloat16)

    batcher = Batcher(run, max_batch_tokens=64, max_concurrent_requests=8, thread=False)

    async def requests():
        jobs = [batcher.submit([[1], [2, 2, 2], [3, 3]]), batcher.submit([[4, 4]])]
        done = await asyncio.gather(*jobs)
        batcher.stop()
        return done

    answers = []
    client = threading.Thread(target=lambda: answers.extend(asyncio.run(requests())))
    client.start()
    batcher.work()
    client.join()
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in answers)
    assert answers[0].tolist() == [[1.0, 1.0], [3.0, 2.0], [2.0, 3.0]] and answers[1].tolist() == [[2.0, 4.0]]
