"""The README's chart: fastbert against the fastest other engine measured beside it, one bar per
headline workload, drawn from benchmarks/headline.csv (rows taken from benchmarks/RESULTS.md, which
has each figure's command).

    python benchmarks/plot_headline.py                 # writes benchmarks/headline.png
    python benchmarks/plot_headline.py --table         # prints the rows as the README's Markdown table
"""
import argparse
import csv
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return [dict(row, low=float(row["low"]), high=float(row["high"])) for row in csv.DictReader(f)]


def ratio(row):
    return f"{row['low']:.2f}x" if row["low"] == row["high"] else f"{row['low']:.2f}-{row['high']:.2f}x"


def table(rows):
    lines = ["| workload | precision | fastbert against | machine, date |", "|---|---|---|---|"]
    for r in rows:
        note = f", {r['note']}" if r["note"] else ""
        lines.append(f"| {r['workload']} | {r['precision']} | **{ratio(r)}** {r['against']}{note} | "
                     f"{r['machine']}, {r['date']} |")
    return "\n".join(lines)


def plot(rows, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.2), dpi=110)
    ys = list(range(len(rows)))[::-1]
    labels = [f"{r['workload']}, {r['precision']}" for r in rows]
    colors = ["#d95f02" if r["precision"] == "int8" else "#1b9e77" for r in rows]
    ax.barh(ys, [r["low"] for r in rows], color=colors, height=0.62)
    # a range (several runs): its upper end as a lighter bar beyond the lower
    ax.barh(ys, [r["high"] - r["low"] for r in rows], left=[r["low"] for r in rows], color=colors, alpha=0.4,
            height=0.62)
    for y, r in zip(ys, rows):
        ax.text(r["high"] + 0.04, y, f"{ratio(r)} {r['against']} ({r['machine']})", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, max(r["high"] for r in rows) * 1.55)
    ax.set_xlabel("times as fast as the fastest other engine measured in the same run")
    ax.set_title("fastbert against the fastest other engine (benchmarks/RESULTS.md)", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(HERE, "headline.csv"))
    parser.add_argument("--out", default=os.path.join(HERE, "headline.png"))
    parser.add_argument("--table", action="store_true", help="print the README's table instead of drawing")
    args = parser.parse_args(argv)
    rows = read_rows(args.data)
    if args.table:
        print(table(rows))
    else:
        plot(rows, args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
