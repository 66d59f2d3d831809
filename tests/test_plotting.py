"""Korean text on figures: the attention map of Korean tokens draws every Hangul glyph (no
"Glyph missing" warning), the font is set for that figure only, and without a Hangul font there is
one warning naming the fix. Drawing is the plot extra: the core import path never imports
matplotlib, and without it each drawing says in one line how to get it (pretraining still trains
and writes its logs)."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from fastbert import attention_maps, plotting

NEEDS_PLOT = 'needs the plot extra: pip install "fastbert[plot]"'

TOKENS = ["[CLS]", "버트", "##는", "문장", "을", "읽", "##는다", ".", "[SEP]"]


def test_korean_attention_map_has_every_glyph(tmp_path):
    assert plotting.hangul_font() is not None, "the plot extra brings NanumGothic (koreanize-matplotlib): no Hangul font"
    n = len(TOKENS)
    probs = torch.softmax(torch.randn(1, 2, n, n), -1)
    import matplotlib

    before = list(matplotlib.rcParams["font.family"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for each box
        attention_maps.draw(probs, TOKENS, str(tmp_path / "ko.png"), [0], [0, 1])
    assert (tmp_path / "ko.png").read_bytes()[:4] == b"\x89PNG"
    assert list(matplotlib.rcParams["font.family"]) == before  # set for that figure only


def test_without_a_hangul_font_one_warning_names_the_fix(monkeypatch):
    monkeypatch.setattr(plotting, "hangul_font", lambda: None)  # as on a system without one
    with pytest.warns(UserWarning, match=r"pip install koreanize-matplotlib"):
        plotting.text_fonts(["한국어"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plotting.text_fonts(["English only"])  # nothing to find, nothing said


def test_has_hangul():
    assert plotting.has_hangul("버트") and plotting.has_hangul("ㅎ") and not plotting.has_hangul("naïve café")


def test_the_core_import_path_does_not_import_matplotlib():
    # import fastbert, a model forward, the command line and a selfcheck case (what the wheel's check
    # runs, in a virtual environment without the plot extra)
    code = """if True:
        import sys
        import torch
        import fastbert
        from fastbert import cli, selfcheck
        import fastbert.commands.selfcheck
        config = fastbert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16)
        model = fastbert.BertModel(config).eval()
        with torch.no_grad():
            model(torch.randint(0, 64, (2, 7)), attention_mask=torch.tensor([[1] * 7, [1] * 4 + [0] * 3]))
        op, shape, dtype = next(c for c in selfcheck.cases("cpu", True) if c[0] == "add_layer_norm")  # small shapes
        assert all(row[1] for row in selfcheck.check_case(op, shape, dtype, selfcheck.available_backends("cpu")[0], "cpu"))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("matplotlib", "koreanize_matplotlib")))
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


@pytest.fixture
def without_matplotlib(monkeypatch):
    """matplotlib not installed, as far as this process can tell: importing it fails."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def test_without_matplotlib_a_drawing_says_in_one_line_how_to_get_it(without_matplotlib, tmp_path, capsys):
    from fastbert.pretraining.logs import plot_curves

    assert plotting.pyplot(what="curves.png") is None
    assert capsys.readouterr().err == f"fastbert: drawing curves.png {NEEDS_PLOT}\n"
    assert plotting.pyplot(quiet=True) is None and capsys.readouterr().err == ""
    log = tmp_path / "log.jsonl"
    log.write_text('{"type": "eval", "step": 0, "mlm_loss": 5.0, "mlm_acc": 0.1}\n')
    assert plot_curves(str(log), str(tmp_path / "curves.png")) is False  # optional: said, and nothing drawn
    assert capsys.readouterr().err == f"fastbert: drawing curves.png {NEEDS_PLOT}\n"
    probs = torch.softmax(torch.randn(1, 1, 3, 3), -1)
    with pytest.raises(RuntimeError, match=r"^drawing map.png needs the plot extra"):  # asked for: an error
        attention_maps.draw(probs, ["a", "b", "c"], str(tmp_path / "map.png"), [0], [0])
    assert capsys.readouterr().err == ""  # the error is the one line
    assert sorted(os.listdir(tmp_path)) == ["log.jsonl"]


def test_pretraining_without_matplotlib_trains_and_writes_its_logs(without_matplotlib, tiny_data, tmp_path, capsys):
    from fastbert.pretraining.trainer import train
    from tests.helpers.pretraining import tiny_config

    out = str(tmp_path / "run")
    result = train(tiny_config(tiny_data, out, max_steps=2, eval_every=1, save_every=1, plot=True))
    assert result.step == 2 and result.last_eval is not None
    assert os.path.getsize(os.path.join(out, "log.jsonl")) > 0 and os.path.isfile(os.path.join(out, "config.json"))
    assert not os.path.exists(os.path.join(out, "curves.png"))
    said = [line for line in capsys.readouterr().err.splitlines() if "plot extra" in line]
    assert said == [f"fastbert: drawing curves.png {NEEDS_PLOT}"]  # once, at the end, not at each checkpoint
