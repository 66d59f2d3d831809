"""One check of two sets of a sentence encoder's outputs (fastbert.token_outputs): dense embeddings,
sparse (ids, weights) per text, ColBERT vectors per text."""
import numpy as np


def assert_same_outputs(got: dict, want: dict, atol: float = 2e-5, rtol: float = 1e-4) -> None:
    """got and want agree on every output both hold (at least one): the same sparse ids, the
    weights and vectors within the tolerances."""
    shared = set(got) & set(want)
    assert shared, (sorted(got), sorted(want))
    if "dense" in shared:
        np.testing.assert_allclose(got["dense"], want["dense"], atol=atol, rtol=rtol)
    if "sparse" in shared:
        assert len(got["sparse"]) == len(want["sparse"])
        for (ids, w), (want_ids, want_w) in zip(got["sparse"], want["sparse"]):
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_allclose(w, want_w, atol=atol, rtol=rtol)
    if "colbert" in shared:
        assert len(got["colbert"]) == len(want["colbert"])
        for vecs, want_vecs in zip(got["colbert"], want["colbert"]):
            np.testing.assert_allclose(vecs, want_vecs, atol=atol, rtol=rtol)
