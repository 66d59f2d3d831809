"""The encoder benchmark's bar chart: tokens/s per provider, fastbert, the peers and the GEMM floor
marked, each bar labelled with its ratio to transformers."""
from __future__ import annotations

import os

from fastbert.bench.report import save_figure
from fastbert.plotting import pyplot


def plot(rows, path):
    plt = pyplot(what=os.path.basename(path))
    if plt is None:
        return
    rows = [r for r in rows if not r.get("skipped")]  # a peer not timed has no bar
    groups = sorted({(r["workload"], r["dtype"]) for r in rows}, key=lambda t: (t[0], t[1]))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4), squeeze=False)
    for ax, (w, d) in zip(axes[0], groups):
        sub = [r for r in rows if r["workload"] == w and r["dtype"] == d]
        colors = ["tab:orange" if r["provider"].startswith("fastbert") else
                  "tab:gray" if r["provider"].startswith("GEMM floor") else
                  "tab:blue" if r["provider"].startswith(("transformers", "sentence-transformers")) else "tab:green"
                  for r in sub]
        ax.barh([r["provider"].replace(f" {d}", "") for r in sub], [r["tokens_per_s"] for r in sub], color=colors)
        for y, r in enumerate(sub):  # the ratio to transformers sdpa (sentence-transformers for minilm)
            ax.text(r["tokens_per_s"], y, f" {r['vs_sdpa']:.2f}x", va="center", fontsize=7)
        ax.set_xlim(0, 1.3 * max(r["tokens_per_s"] for r in sub))
        ax.set_title(f"{w} {d}", fontsize=9)
        ax.set_xlabel("real tokens / s", fontsize=8)
        ax.tick_params(labelsize=7)
    save_figure(fig, path)
