"""Random sentences of a small mixed Korean-English word list: corpora for the embedding runs, local
and on Ray."""
import numpy as np

WORDS = ("cat dog tree river 한국어 문장 model sentence quick brown fox jumps over lazy night city rain "
         "train station book library").split()


def texts(n, seed=0, longest=40):
    """n seeded sentences of 3 to longest - 1 words."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, longest)))) for _ in range(n)]
