"""matplotlib for every figure fastbert draws (benchmark charts, training curves, attention maps),
and fonts for the text on them.

Drawing is the `plot` extra (pip install "fastbert[plot]": matplotlib and koreanize-matplotlib's
font); nothing else in fastbert needs it. Without it `pyplot()` is None and says in one line how to
get it: pretraining trains and writes its logs without its curves, an attention map is an error.

matplotlib's default font (DejaVu Sans) has no Hangul: Korean tokens and labels would come out as
empty boxes. `text_fonts(texts)` finds a font with Hangul when the texts hold any and sets it, for
the figure drawn inside the block only, after DejaVu Sans in the family list, so Latin text keeps
its look and every Hangul glyph comes from the other font (matplotlib falls back glyph by glyph).
Where it looks, in order: the NanumGothic that the plot extra brings (the font file of the
koreanize-matplotlib package, used without importing that package, which would restyle every
figure of the process), then fonts the system has (Noto Sans CJK, Nanum, Malgun Gothic,
AppleGothic, UnDotum, Baekmuk). Without one: a single warning naming the fix.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import warnings
from typing import Iterable, Optional

SYSTEM_HANGUL_FONTS = ("Noto Sans CJK KR", "Noto Sans KR", "Noto Sans CJK JP", "NanumGothic", "NanumBarunGothic",
                       "Malgun Gothic", "AppleGothic", "Apple SD Gothic Neo", "UnDotum", "Baekmuk Gulim")
_found: list = []  # [font family name or None] once looked for
PLOT_EXTRA = 'pip install "fastbert[plot]"'


def missing(what: str) -> str:
    """The line that says how to draw `what` (a file name) where matplotlib is not installed."""
    return f"drawing {what} needs the plot extra: {PLOT_EXTRA}"


def pyplot(quiet: bool = False, what: str = "the figure"):
    """matplotlib.pyplot on the Agg backend, or None without matplotlib (saying in one line on stderr,
    unless quiet, how to get it for drawing `what`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not quiet:
            print(f"fastbert: {missing(what)}", file=sys.stderr, flush=True)
        return None
    return plt


def has_hangul(text: str) -> bool:
    """Hangul syllables, jamo or compatibility jamo in `text`."""
    return any("\uac00" <= c <= "\ud7a3" or "\u1100" <= c <= "\u11ff" or "\u3130" <= c <= "\u318f" for c in text)


def _bundled_font() -> Optional[str]:
    spec = importlib.util.find_spec("koreanize_matplotlib")
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(base, "fonts", "NanumGothic.ttf")
        if os.path.isfile(path):
            return path
    return None


def hangul_font() -> Optional[str]:
    """The family name of a font with Hangul that matplotlib can use, or None."""
    if not _found:
        from matplotlib import font_manager

        name = None
        path = _bundled_font()
        if path is not None:
            font_manager.fontManager.addfont(path)
            name = font_manager.FontProperties(fname=path).get_name()
        else:
            available = {f.name for f in font_manager.fontManager.ttflist}
            name = next((n for n in SYSTEM_HANGUL_FONTS if n in available), None)
        _found.append(name)
    return _found[0]


def text_fonts(texts: Iterable[str]):
    """A context for drawing a figure whose text is `texts`: a Hangul font in the family list when
    they hold Hangul (see the module docstring), else nothing."""
    if not any(has_hangul(t) for t in texts):
        return contextlib.nullcontext()
    import matplotlib

    name = hangul_font()
    if name is None:
        warnings.warn("fastbert: no font with Hangul found, Korean text will show as boxes: pip install "
                      f"koreanize-matplotlib (NanumGothic; the plot extra has it: {PLOT_EXTRA}) or install a Noto "
                      "Sans CJK font", stacklevel=2)
        return contextlib.nullcontext()
    family = ["DejaVu Sans", name]
    return matplotlib.rc_context({"font.family": family, "font.sans-serif": family})
