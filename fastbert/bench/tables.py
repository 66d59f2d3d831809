"""The encoder benchmark's tables: medians to rows (tokens/s, the ratios), and printing them."""
from __future__ import annotations

import statistics
import sys
from typing import Dict, List, Optional, Sequence

from fastbert.dtypes import dtype_name


def pick_fastest(med: Dict[str, float], prefix: str) -> Optional[str]:
    """Set med[prefix] to the fastest of the variants "<prefix>" and "<prefix> <variant>"; return
    the variant picked ("" for the plain one), or None when there is none."""
    variants = {k: v for k, v in med.items() if k == prefix or k.startswith(prefix + " ")}
    if not variants:
        return None
    best = min(variants, key=variants.get)
    med[prefix] = variants[best]
    return best[len(prefix):].strip()


def summarise(times: Dict[str, List[float]], tokens: int, dtypes, errors: Optional[Dict[str, float]] = None,
              peers: Sequence[str] = ()) -> List[dict]:
    """Rows per dtype: fastbert, transformers sdpa / eager (the faster of cast and autocast in bf16,
    as a user would pick), each peer timed, and the GEMM floor (its fastest path); with tokens/s,
    the ratios to transformers sdpa, to the fastest peer and to the floor, and the max abs error."""
    med = {k: statistics.median(v) for k, v in times.items()}
    errors = errors or {}
    rows = []
    for dtype in dtypes:
        tag = dtype_name(dtype)
        floor_paths = {k.rsplit(" ", 1)[-1]: v * 1e3 for k, v in med.items() if k.startswith(f"GEMM floor {tag} ")}
        ours = ("transformers sdpa", "transformers eager") if tag != "int8" else ()
        picked = {f"{p} {tag}": pick_fastest(med, f"{p} {tag}") for p in (*ours, "GEMM floor")}
        peer_names = [f"{p} {tag}" for p in peers if f"{p} {tag}" in med]
        fastest_peer = min((med[n] for n in peer_names), default=None)
        # int8 rows are compared with transformers in fp32 (and fastbert int8 with fastbert fp32)
        base, floor = med[f"transformers sdpa {'fp32' if tag == 'int8' else tag}"], med[f"GEMM floor {tag}"]
        variants = [k for k in med if k.startswith(f"fastbert {tag} (")]  # int8 on full-range weights
        names = [f"fastbert {tag}", *variants, *(f"{p} {tag}" for p in ours), *peer_names, f"GEMM floor {tag}"]
        for name in names:
            rows.append({
                "provider": name, "dtype": tag, "ms": med[name] * 1e3, "tokens_per_s": tokens / med[name],
                "vs_sdpa": base / med[name], "vs_floor": med[name] / floor,
                "vs_peer": None if fastest_peer is None else fastest_peer / med[name],
                "max_abs_err": errors.get(f"{name} {picked[name]}" if picked.get(name) else name),
                "picked": picked.get(name) or None,
                **({"floor_paths_ms": floor_paths} if name.startswith("GEMM floor") else {}),
                **({"vs_fastbert_fp32": med["fastbert fp32"] / med[name]}
                   if name.startswith("fastbert int8") and "fastbert fp32" in med else {}),
            })
    return rows


def print_ablations(rows, out=sys.stdout):
    print(f"{'workload':<9}{'variant':<30}{'ms/batch':>11}{'tokens/s':>11}"
          f"{'time vs fastbert':>18}{'vs GEMM floor':>15}", file=out)
    for r in rows:
        print(f"{r['workload']:<9}{r['provider']:<30}{r['ms']:>11.1f}{r['tokens_per_s']:>11.0f}{r['vs_fastbert']:>17.2f}x"
              f"{r['vs_floor']:>14.2f}x", file=out)


def print_table(rows, out=sys.stdout):
    peers = any(r.get("vs_peer") is not None for r in rows)
    print(f"{'workload':<9}{'provider':<36}{'ms/batch':>11}{'tokens/s':>11}{'vs transformers':>17}"
          + (f"{'vs fastest peer':>17}" if peers else "") + f"{'vs GEMM floor':>15}{'max abs err':>13}", file=out)
    for r in rows:
        if r.get("skipped"):
            print(f"{r['workload']:<9}{r['provider']:<36}skipped: {r['skipped']}", file=out)
            continue
        floor = f"{r['vs_floor']:.2f}x" if r.get("vs_floor") else "-"
        err = f"{r['max_abs_err']:.1e}" if r.get("max_abs_err") is not None else "-"
        peer = (f"{r['vs_peer']:>16.2f}x" if r.get("vs_peer") is not None else f"{'-':>17}") if peers else ""
        name = r["provider"] + (f" ({r['picked']})" if r.get("picked") else "")
        print(f"{r['workload']:<9}{name:<36}{r['ms']:>11.1f}{r['tokens_per_s']:>11.0f}{r['vs_sdpa']:>16.2f}x{peer}"
              f"{floor:>15}{err:>13}", file=out)
        if r.get("floor_paths_ms"):
            paths = ", ".join(f"{p} {ms:.0f}" for p, ms in sorted(r["floor_paths_ms"].items(), key=lambda t: t[1]))
            print(f"{'':<9}  the floor on each GEMM path, ms: {paths}", file=out)
    print("vs transformers = transformers sdpa time (same dtype; sentence-transformers for minilm) / this time; "
          + ("vs fastest peer = the fastest peer's time / this time; " if peers else "")
          + "vs GEMM floor = this time / the floor's (the model's linears alone on the real tokens, on the "
          "fastest GEMM path, named); max abs err = "
          "against transformers fp32 on the real tokens", file=out)
    for r in rows:
        if r.get("vs_fastbert_fp32") is not None:
            print(f"{r['workload']}: {r['provider']} runs {r['vs_fastbert_fp32']:.2f}x as fast as its fp32 counterpart "
                  "(int8 rows: vs transformers = transformers fp32 time / this time)", file=out)
    for r in rows:
        if r.get("int8_vs_fp32"):
            from fastbert.bench.accuracy import format_figures

            print(f"minilm: {r['provider']}: {format_figures(r['int8_vs_fp32'])}", file=out)
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
