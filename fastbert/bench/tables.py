"""The encoder benchmark's tables: medians to rows (tokens/s, the ratios), and printing them."""
from __future__ import annotations

import statistics
import sys
from typing import Dict, List

from fastbert.dtypes import dtype_name


def summarise(times: Dict[str, List[float]], tokens: int, dtypes) -> List[dict]:
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for dtype in dtypes:
        tag = dtype_name(dtype)
        # transformers in bf16: the faster of cast and autocast, as a user would pick
        for impl in ("sdpa", "eager"):
            variants = {k: v for k, v in med.items() if k.startswith(f"transformers {impl} {tag}")}
            if variants:
                best = min(variants, key=variants.get)
                med[f"transformers {impl} {tag}"] = variants[best]
                if best != f"transformers {impl} {tag}":
                    med.setdefault("_picked", {})[f"transformers {impl} {tag}"] = best
        base, floor = med[f"transformers sdpa {tag}"], med[f"GEMM floor {tag}"]
        for name in (f"fastbert {tag}", f"transformers sdpa {tag}", f"transformers eager {tag}", f"GEMM floor {tag}"):
            rows.append({
                "provider": name, "dtype": tag, "ms": med[name] * 1e3, "tokens_per_s": tokens / med[name],
                "vs_sdpa": base / med[name], "vs_floor": med[name] / floor,
                "picked": med.get("_picked", {}).get(name),
            })
    return rows


def print_ablations(rows, out=sys.stdout):
    print(f"{'workload':<9}{'variant':<30}{'ms/batch':>11}{'tokens/s':>11}"
          f"{'time vs fastbert':>18}{'vs GEMM floor':>15}", file=out)
    for r in rows:
        print(f"{r['workload']:<9}{r['provider']:<30}{r['ms']:>11.1f}{r['tokens_per_s']:>11.0f}{r['vs_fastbert']:>17.2f}x"
              f"{r['vs_floor']:>14.2f}x", file=out)


def print_table(rows, out=sys.stdout):
    print(f"{'workload':<9}{'provider':<30}{'ms/batch':>11}{'tokens/s':>11}"
          f"{'vs transformers':>17}{'vs GEMM floor':>15}", file=out)
    for r in rows:
        floor = f"{r['vs_floor']:.2f}x" if r.get("vs_floor") else "-"
        name = r["provider"] + (f" ({r['picked'].rsplit(' ', 1)[-1]})" if r.get("picked") else "")
        print(f"{r['workload']:<9}{name:<30}{r['ms']:>11.1f}{r['tokens_per_s']:>11.0f}{r['vs_sdpa']:>16.2f}x{floor:>15}",
              file=out)
    print("vs transformers = transformers sdpa time (same dtype; sentence-transformers for minilm) / this time; "
          "vs GEMM floor = this time / the floor's", file=out)
    cos = [r["min_cosine"] for r in rows if "min_cosine" in r]
    if cos:
        print(f"minilm: lowest cosine between fastbert and sentence-transformers embeddings {cos[0]:.7f}", file=out)


def print_timings(rows, keys, names, fused: str, rate: str, width: int, out=sys.stdout) -> None:
    """A kernel benchmark's table: the key columns (header, width, row -> text), ms per provider,
    the fused provider's rate (rows' `rate` dict, e.g. GB/s or TFLOP/s), the roofline floor when
    the rows have one, and the speedup."""
    floor = any("roofline_ms" in r for r in rows)
    head = "".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w, _) in enumerate(keys))
    head += "".join(f"{n + ' ms':>{width}}" for n in names) + f"{fused + ' ' + rate:>{width}}"
    print(head + (f"{'floor ms':>10}" if floor else "") + f"{'speedup':>10}", file=out)
    for r in rows:
        line = "".join(f"{fmt(r):<{w}}" if i == 0 else f"{fmt(r):>{w}}" for i, (_, w, fmt) in enumerate(keys))
        line += "".join(f"{r['ms'][n]:>{width}.3f}" for n in names) + f"{r[rate][fused]:>{width}.3f}"
        if "roofline_ms" in r:
            line += f"{r['roofline_ms']:>10.3f}"
        print(line + f"{r['speedup']:>9.2f}x", file=out)
