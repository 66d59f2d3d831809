"""Korean text on figures: the attention map of Korean tokens draws every Hangul glyph (no
"Glyph missing" warning), the font is set for that figure only, and without a Hangul font there is
one warning naming the fix."""
import warnings

import pytest
import torch

from fastbert import maps, plotting

TOKENS = ["[CLS]", "버트", "##는", "문장", "을", "읽", "##는다", ".", "[SEP]"]


def test_korean_attention_map_has_every_glyph(tmp_path):
    assert plotting.hangul_font() is not None, "the install brings NanumGothic (koreanize-matplotlib): no Hangul font"
    n = len(TOKENS)
    probs = torch.softmax(torch.randn(1, 2, n, n), -1)
    import matplotlib

    before = list(matplotlib.rcParams["font.family"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for each box
        maps.draw(probs, TOKENS, str(tmp_path / "ko.png"), [0], [0, 1])
    assert (tmp_path / "ko.png").read_bytes()[:4] == b"\x89PNG"
    assert list(matplotlib.rcParams["font.family"]) == before  # set for that figure only


def test_without_a_hangul_font_one_warning_names_the_fix(monkeypatch):
    monkeypatch.setattr(plotting, "_found", [None])
    with pytest.warns(UserWarning, match=r"pip install koreanize-matplotlib"):
        plotting.text_fonts(["한국어"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plotting.text_fonts(["English only"])  # nothing to find, nothing said


def test_has_hangul():
    assert plotting.has_hangul("버트") and plotting.has_hangul("ㅎ") and not plotting.has_hangul("naïve café")
