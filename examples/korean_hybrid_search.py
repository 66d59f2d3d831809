"""Korean passages ranked by BGE-M3's three scores combined, from one forward of each text.

BGE-M3 gives a dense embedding, sparse lexical weights and ColBERT multi-vectors from the same
pass (fastbert.SentenceEncoder(...).encode(output="all")); BGE-M3's authors rank by a weighted sum
of the three scores (FlagEmbedding's compute_score, weights 0.4 dense, 0.2 sparse, 0.4 ColBERT).
The lexical score rewards the query's own words (a station's or a dish's name), the dense one
meaning, ColBERT each query token's best match: Korean queries, whose particles and compounds
split into many pieces, gain from all three.

    python examples/korean_hybrid_search.py path/to/bge-m3 [--query "서울역 근처 국숫집"] [--weights 0.4,0.2,0.4]
"""
import argparse

import numpy as np

import fastbert
from fastbert.token_outputs import colbert_score, sparse_score

PASSAGES = [
    "서울역 뒤편 골목에는 오래된 국숫집이 있어 출장 온 사람들이 점심을 먹는다.",
    "부산역 앞 시장에서는 돼지국밥과 어묵을 파는 가게가 아침부터 문을 연다.",
    "서울역에서 KTX를 타면 부산까지 두 시간 반 정도 걸린다.",
    "전주 한옥마을의 비빔밥집은 주말마다 관광객으로 붐빈다.",
    "회사 근처 칼국수 가게는 비 오는 날 손님이 두 배로 는다.",
    "The noodle shop near Seoul Station opens at eleven.",
    "강릉 바닷가 카페에서는 커피 축제가 해마다 열린다.",
    "서울 지하철 1호선과 4호선이 서울역에서 만난다.",
]


def rank(encoder, query: str, passages, weights=(0.4, 0.2, 0.4)):
    """[(combined, dense, sparse, colbert, passage)] best first: BGE-M3's three scores of each
    passage against the query and their weighted sum."""
    q = encoder.encode([query], output="all")
    p = encoder.encode(list(passages), output="all")
    dense = p["dense"] @ q["dense"][0]
    rows = []
    for i, text in enumerate(passages):
        s = sparse_score(q["sparse"][0], p["sparse"][i])
        c = colbert_score(q["colbert"][0], p["colbert"][i])
        combined = weights[0] * float(dense[i]) + weights[1] * s + weights[2] * c
        rows.append((combined, float(dense[i]), s, c, text))
    return sorted(rows, key=lambda r: -r[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a BGE-M3 directory (sparse_linear.pt and colbert_linear.pt beside its config)")
    ap.add_argument("--query", default="서울역 근처 국숫집")
    ap.add_argument("--weights", default="0.4,0.2,0.4", help="dense, sparse, ColBERT (BGE-M3's: 0.4,0.2,0.4)")
    args = ap.parse_args(argv)
    weights = tuple(float(w) for w in args.weights.split(","))
    if len(weights) != 3 or not np.all(np.isfinite(weights)):
        ap.error("--weights takes three numbers: dense, sparse, ColBERT")
    ranked = rank(fastbert.SentenceEncoder(args.model), args.query, PASSAGES, weights)
    print(f"query: {args.query}")
    print(f"{'combined':>9}{'dense':>8}{'sparse':>8}{'colbert':>8}  passage")
    for combined, d, s, c, text in ranked:
        print(f"{combined:>9.3f}{d:>8.3f}{s:>8.3f}{c:>8.3f}  {text}")
    return ranked


if __name__ == "__main__":
    main()
