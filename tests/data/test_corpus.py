"""Reading corpora: both layouts, sentence splitting, and every skipped line counted."""
import pytest

from fastbert.data import default_corpus
from fastbert.data.corpus import CorpusStats, read_documents, sniff_format, split_sentences
from tests.helpers.pretraining import write


def test_split_sentences():
    text = 'He came home. "Is it late?" she asked. Dr. Smith, e.g. the doctor, left at 5 p.m. today. J. R. wrote 3 books!'
    assert split_sentences(text) == [
        "He came home.", '"Is it late?" she asked.', "Dr. Smith, e.g. the doctor, left at 5 p.m. today.",
        "J. R. wrote 3 books!",
    ]
    assert split_sentences("  ") == []
    assert split_sentences("no end") == ["no end"]


def test_lines_layout_blank_line_between_documents(tmp_path):
    p = write(str(tmp_path / "c.txt"), "First one.\nSecond one.\n\n\nOther doc.\n\nThird doc line.\nMore.\n")
    stats = CorpusStats()
    docs = list(read_documents([p], "lines", stats))
    assert docs == [["First one.", "Second one."], ["Other doc."], ["Third doc line.", "More."]]
    assert stats.documents == 3 and stats.sentences == 5 and stats.skipped_lines == 0


def test_paragraphs_layout(tmp_path):
    text = ("The first paragraph is wrapped\nover two lines. It has two sentences.\n\n"
            "A second paragraph. Same document.\n\n\nA new document starts here.\n")
    p = write(str(tmp_path / "c.txt"), text)
    assert sniff_format(p) == "paragraphs"
    docs = list(read_documents([p], "auto"))
    assert docs == [["The first paragraph is wrapped over two lines.", "It has two sentences.",
                     "A second paragraph.", "Same document."], ["A new document starts here."]]


def test_bad_lines_and_files_are_counted_and_skipped(tmp_path):
    good = "Fine sentence one.\n".encode() + b"\xff\xfe broken \xc3\x28 bytes\n" + b"\x01\x02\x03\n" + "Fine two.\n".encode()
    write(str(tmp_path / "d" / "a.txt"), good, "wb")
    write(str(tmp_path / "d" / "b.bin"), bytes(range(256)) * 10, "wb")
    write(str(tmp_path / "d" / "c.txt"), "", "w")
    stats = CorpusStats()
    docs = list(read_documents([str(tmp_path / "d")], "lines", stats))
    assert docs == [["Fine sentence one.", "Fine two."]]
    assert stats.undecodable_lines == 1 and stats.empty_lines == 1
    assert len(stats.binary_files) == 1 and stats.binary_files[0].endswith("b.bin")
    assert len(stats.empty_files) == 1 and stats.files == 3


def test_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(read_documents([str(tmp_path / "nope.txt")]))


def test_default_corpus_is_english_prose_in_many_documents():
    docs = list(default_corpus.documents())
    assert len(docs) >= 50
    words = sum(len(s.split()) for d in docs for s in d)
    assert words > 20_000
    assert all(s and "\n" not in s for d in docs for s in d)
