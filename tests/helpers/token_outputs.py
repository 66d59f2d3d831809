"""One check of two sets of a sentence encoder's outputs (fastbert.token_outputs): dense embeddings,
sparse (ids, weights) per text, ColBERT vectors per text."""
import numpy as np


def assert_same_sparse(got, want, atol: float = 2e-5, rtol: float = 1e-4) -> None:
    """Two sparse vectors, each (ids, weights), agree as vectors of the vocabulary's size: the same
    weight within the tolerances at every id either holds, an id only one holds weighing at most
    atol (a term whose logit sits at zero can fall either side of the ReLU when the sums run in
    another order, as two batchings of the same texts do)."""
    got_ids, got_w = (np.asarray(a) for a in got)
    want_ids, want_w = (np.asarray(a) for a in want)
    ids = np.union1d(got_ids, want_ids)
    dense = np.zeros((2, len(ids)), np.float64)
    dense[0, np.searchsorted(ids, got_ids)] = got_w
    dense[1, np.searchsorted(ids, want_ids)] = want_w
    np.testing.assert_allclose(dense[0], dense[1], atol=atol, rtol=rtol, err_msg=f"ids {ids.tolist()[:8]}...")


def assert_same_outputs(got: dict, want: dict, atol: float = 2e-5, rtol: float = 1e-4) -> None:
    """got and want agree on every output both hold (at least one): the sparse vectors (see
    assert_same_sparse), the weights and vectors within the tolerances."""
    shared = set(got) & set(want)
    assert shared, (sorted(got), sorted(want))
    if "dense" in shared:
        np.testing.assert_allclose(got["dense"], want["dense"], atol=atol, rtol=rtol)
    if "sparse" in shared:
        assert len(got["sparse"]) == len(want["sparse"])
        for pair, want_pair in zip(got["sparse"], want["sparse"]):
            assert_same_sparse(pair, want_pair, atol, rtol)
    if "colbert" in shared:
        assert len(got["colbert"]) == len(want["colbert"])
        for vecs, want_vecs in zip(got["colbert"], want["colbert"]):
            np.testing.assert_allclose(vecs, want_vecs, atol=atol, rtol=rtol)
