"""`fastbert prepare`: vocabularies, the pairs written, the summary, and bad input."""
import json
import os

import pytest

from fastbert import cli
from fastbert.data.prepare import PrepareError, prepare_data
from fastbert.data.pretraining_shards import InstanceDataset, read_index
from tests.helpers.pretraining import write

TEXT = [
    ["The cat sat on the mat.", "It was a sunny day.", "The dog barked at the cat.", "Then it ran away."],
    ["Python is a programming language.", "It has dynamic types.", "Lists hold items in order."],
    ["Rivers flow to the sea.", "The sea is salty.", "Fish swim in rivers and seas.", "Boats sail on them."],
]


def corpus_file(tmp_path, docs=TEXT, name="corpus.txt", repeat=20):
    blocks = ["\n".join(d) for _ in range(repeat) for d in docs]
    return write(str(tmp_path / name), "\n\n".join(blocks) + "\n")


def test_prepare_trains_a_vocabulary_and_writes_pairs(tmp_path):
    path = corpus_file(tmp_path)
    out = str(tmp_path / "out")
    index = prepare_data(out, corpus=[path], vocab_size=120, max_seq_length=24, dupe_factor=2, eval_fraction=0.0,
                         progress=False, log=lambda *a: None)
    assert set(index["special_tokens"]) >= {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    s = index["summary"]
    assert s["documents"] == 60 and s["sentences"] == 220
    ds = InstanceDataset(out, "train")
    assert len(ds) == index["splits"]["train"]["instances"] > 50
    cls, sep = index["special_tokens"]["[CLS]"], index["special_tokens"]["[SEP]"]
    for i in range(len(ds)):
        ids, a, label = ds[i]
        assert len(ids) <= 24 and ids[0] == cls and ids[a - 1] == sep and ids[-1] == sep and label in (0, 1)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert os.path.isfile(os.path.join(out, f))
    # the saved vocabulary loads in transformers and tokenizes as the pairs were made
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("[MASK]") == index["special_tokens"]["[MASK]"]


def test_prepare_with_a_given_vocab_txt_and_the_cli(tmp_path, capsys):
    path = corpus_file(tmp_path)
    first = str(tmp_path / "first")
    prepare_data(first, corpus=[path], vocab_size=120, max_seq_length=24, dupe_factor=1, progress=False, log=lambda *a: None)
    out = str(tmp_path / "second")
    rc = cli.main(["prepare", path, "--out", out, "--vocab", os.path.join(first, "vocab.txt"), "--max-seq-length", "24",
                   "--eval-fraction", "0.1", "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    for word in ("documents", "sentences", "pairs (train)", "pairs (eval)", "skipped: undecodable lines"):
        assert word in printed
    a, b = read_index(first), read_index(out)
    assert a["vocab_size"] == b["vocab_size"] and a["special_tokens"] == b["special_tokens"]
    assert b["splits"]["eval"]["documents"] == 6
    # a tokenizer.json works as well, and gives the same ids
    third = str(tmp_path / "third")
    prepare_data(third, corpus=[path], vocab=os.path.join(first, "tokenizer.json"), max_seq_length=24, dupe_factor=5,
                 eval_fraction=0.1, progress=False, log=lambda *a: None)
    x, y = InstanceDataset(out, "train"), InstanceDataset(third, "train")
    assert len(x) == len(y) and all((x[i][0] == y[i][0]).all() for i in range(len(x)))


def test_undecodable_and_binary_input_is_counted(tmp_path, capsys):
    path = corpus_file(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\n\xff\xfe\xfa not utf8\nA good last line.\n")
    write(str(tmp_path / "blob.dat"), bytes(range(256)) * 40, "wb")
    out = str(tmp_path / "out")
    with pytest.warns(UserWarning, match="binary"):
        index = prepare_data(out, corpus=[path, str(tmp_path / "blob.dat")], vocab_size=120, max_seq_length=24,
                             dupe_factor=1, progress=False, log=lambda *a: None)
    c = index["summary"]["corpus"]
    assert c["skipped_undecodable_lines"] == 1 and len(c["skipped_binary_files"]) == 1


@pytest.mark.parametrize("case", ["missing", "empty", "binary", "one_document", "bad_vocab"])
def test_bad_input_gets_a_clear_error(tmp_path, case, capsys):
    args = ["prepare", "--out", str(tmp_path / "out"), "--no-progress", "--vocab-size", "100"]
    if case == "missing":
        args.insert(1, str(tmp_path / "nope.txt"))
        expect = "does not exist"
    elif case == "empty":
        args.insert(1, write(str(tmp_path / "empty.txt"), "\n\n  \n"))
        expect = "no text"
    elif case == "binary":
        args.insert(1, write(str(tmp_path / "x.bin"), bytes(range(256)) * 40, "wb"))
        expect = "binary"
    elif case == "one_document":
        args.insert(1, write(str(tmp_path / "one.txt"), "\n".join(TEXT[0] * 30) + "\n"))
        expect = "1 document"
    else:
        args.insert(1, corpus_file(tmp_path))
        vocab = write(str(tmp_path / "vocab.txt"), "[UNK]\n[PAD]\nthe\ncat\n##s\n")
        args += ["--vocab", vocab]
        expect = r"lacks the special token\(s\) \[CLS\], \[SEP\], \[MASK\]"
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastbert prepare: error: ") and len(err.splitlines()) == 1, err
    import re

    assert re.search(expect, err), err
    assert not os.path.exists(str(tmp_path / "out" / "index.json"))


def test_prepare_raises_prepare_error_for_no_text(tmp_path):
    with pytest.raises(PrepareError):
        prepare_data(str(tmp_path / "o"), documents=lambda: iter([]), vocab_size=50, progress=False, log=lambda *a: None)


def test_index_records_the_summary(tiny_data):
    index = read_index(tiny_data)
    assert index["summary"]["documents"] == 60
    assert json.dumps(index)  # plain JSON
    assert index["splits"]["eval"]["instances"] > 0
