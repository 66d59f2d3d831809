"""How far one set of sentence embeddings is from a reference set (int8 against fp32): the figures
the int8 test asserts and the int8 benchmark prints.

    mean_cosine / min_cosine   cosine between each sentence's two embeddings
    nn_agreement               the share of sentences whose nearest neighbour (among all the other
                               sentences, by cosine) is the reference's, counted over the sentences
                               whose reference nearest neighbour leads the second by more than
                               `margin` (closer calls are ties that any rounding may flip); `clear`
                               is how many those are
    top10_overlap              |top-10 neighbours ∩ the reference's top 10| / 10, averaged
"""
from __future__ import annotations

from typing import Dict

import numpy as np

TARGETS = {"mean_cosine": 0.997, "min_cosine": 0.985, "nn_agreement": 0.99, "top10_overlap": 0.95}


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def embedding_agreement(reference: np.ndarray, other: np.ndarray, margin: float = 0.01, k: int = 10) -> Dict[str, float]:
    """The figures above for embeddings [n, dim] of the same n sentences."""
    a, b = _unit(reference), _unit(other)
    if a.shape != b.shape or a.shape[0] <= k:
        raise ValueError(f"embedding_agreement: needs two [n, dim] sets of the same shape with n > {k}, "
                         f"got {a.shape} and {b.shape}")
    cos = (a * b).sum(1)
    sa, sb = a @ a.T, b @ b.T
    np.fill_diagonal(sa, -np.inf)
    np.fill_diagonal(sb, -np.inf)
    top_a = np.argsort(-sa, axis=1, kind="stable")[:, :k]
    top_b = np.argsort(-sb, axis=1, kind="stable")[:, :k]
    best = np.take_along_axis(sa, top_a[:, :2], axis=1)
    clear = best[:, 0] - best[:, 1] > margin
    overlap = np.mean([len(set(x) & set(y)) / k for x, y in zip(top_a, top_b)])
    return {
        "mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
        "nn_agreement": float((top_a[:, 0] == top_b[:, 0])[clear].mean()) if clear.any() else 1.0,
        "clear": int(clear.sum()), "top10_overlap": float(overlap), "sentences": int(a.shape[0]),
    }


def meets_targets(figures: Dict[str, float]) -> Dict[str, bool]:
    """{figure: whether it meets its target in TARGETS}."""
    return {k: figures[k] >= t for k, t in TARGETS.items()}


def format_figures(figures: Dict[str, float]) -> str:
    return (f"cosine to fp32 mean {figures['mean_cosine']:.5f} (>= {TARGETS['mean_cosine']}), "
            f"min {figures['min_cosine']:.5f} (>= {TARGETS['min_cosine']}); nearest neighbour as fp32's for "
            f"{100 * figures['nn_agreement']:.2f}% of the {figures['clear']} clear ones (>= 99%); "
            f"top-10 overlap {100 * figures['top10_overlap']:.2f}% (>= 95%); {figures['sentences']} sentences")
