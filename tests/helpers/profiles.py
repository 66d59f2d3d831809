"""How many times each of fastbert's ops ran in a call, as torch.profiler names them (fastbert::<op>)."""
import collections

import torch


def fastbert_op_counts(fn) -> collections.Counter:
    """{op name without "fastbert::": calls} of fastbert's fused ops while fn() runs."""
    with torch.profiler.profile() as prof:
        fn()
    return collections.Counter(e.name.removeprefix("fastbert::") for e in prof.events()
                               if e.name.startswith("fastbert::"))
