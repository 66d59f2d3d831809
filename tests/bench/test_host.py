"""The host cost of the CUDA code path, counted on the CPU (fastbert.bench.host,
benchmarks/bench_host.py): a change that adds a Triton launch, an aten call that launches or
allocates, or a host sync to an op or a layer fails here; one that removes some lowers the table."""
import pytest

pytest.importorskip("triton")

from fastbert.bench import host  # noqa: E402

pytestmark = pytest.mark.triton

# (call, training) -> (Triton launches, aten calls that launch or allocate, host syncs), BERT-base sizes
COUNTS = {
    ("attention", False): (2, 3, 0),
    ("attention", True): (6, 11, 1),
    ("add_layer_norm", False): (1, 1, 0),
    ("add_layer_norm", True): (2, 9, 1),
    ("bias_gelu", False): (1, 1, 0),
    ("bias_gelu", True): (2, 7, 0),
    ("geglu", False): (1, 1, 0),
    ("geglu", True): (2, 5, 0),
    ("bert x1", False): (5, 23, 4),
    ("bert x3", False): (13, 31, 4),
    ("bert x1", True): (12, 58, 5),
    ("bert x3", True): (32, 98, 7),
    ("modernbert x1", False): (4, 21, 4),
    ("modernbert x3", False): (12, 31, 4),
    ("modernbert x1", True): (10, 43, 4),
    ("modernbert x3", True): (30, 75, 4),
}


@pytest.fixture(scope="module")
def rows():
    return {(r.name, r.training): r.counts for r in host.measure(host.cases(), time_calls=False)}


def test_a_layers_share_of_unlike_layers_is_refused():
    # a layer's row shares the difference of two models among the layers between them: counts that
    # do not divide mean the layers are not alike, and the row would be no one layer's
    assert host.Counts(8, 12, 4, 0).per(2) == host.Counts(4, 6, 2, 0)
    with pytest.raises(ValueError, match="do not divide"):
        host.Counts(9, 12, 4, 0).per(2)


def test_every_call_is_counted(rows):
    assert set(COUNTS) <= set(rows)
    assert {("bert layer", t) for t in (False, True)} <= set(rows)


@pytest.mark.parametrize("call", sorted(COUNTS), ids=lambda c: f"{c[0]}-{'training' if c[1] else 'inference'}")
def test_the_host_does_no_more_than_it_did(rows, call):
    c = rows[call]
    now, table = (c.launches, c.work, c.syncs), COUNTS[call]
    assert all(n <= t for n, t in zip(now, table)), f"{call}: (launches, launch/alloc, syncs) {table} -> {now}"
    assert now == table, f"{call}: {table} -> {now}, fewer: lower COUNTS"


def test_a_bert_layer_in_inference_is_its_gemms_and_kernels(rows):
    # what the GPU's queue receives per BERT layer in inference: 4 GEMMs and 4 kernels, no
    # allocation, no sync (the target: at most 10 operations)
    c = rows[("bert layer", False)]
    assert (c.launches, c.work, c.syncs) == (4, 4, 0) and c.operations <= 10


def test_a_modernbert_layer_in_inference_is_its_gemms_kernels_and_geglu_output(rows):
    # ModernBERT's layer (a sliding one, after the first): 4 GEMMs, 4 kernels and the GeGLU's
    # output, the one tensor no input of the same shape dies to make room for
    c = rows[("modernbert layer", False)]
    assert (c.launches, c.work, c.syncs) == (4, 5, 0) and c.operations <= 10


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_layer_in_training_is_its_gemms_kernels_one_allocation_each_way_and_its_bias_sums(rows, family):
    # forward + backward of one layer (the target: at most 30 operations): 12 GEMMs, 10 kernels, what
    # each direction writes besides the GEMMs' outputs from one allocation (kernels.empty_parts), the
    # reductions of the partial sums and biases; BERT also draws its dropout seed
    c = rows[(f"{family} layer", True)]
    assert c.syncs <= 1 and c.operations <= 30, c


def test_the_counters_see_launches_aten_calls_and_syncs():
    # the counters themselves: a test that cannot fail would prove nothing
    import torch

    def work():
        x = torch.ones(4)
        y = x.view(2, 2).t()  # views: counted as aten calls only
        host.require_interpreter()
        from fastbert.kernels.bias_gelu import bias_gelu_forward

        bias_gelu_forward(x.view(1, 4), torch.zeros(4), "none")  # one launch (and its output's allocation)
        return y.sum().item(), x.tolist()  # a launch on a GPU, and two syncs

    c = host.count(work)
    assert c.launches == 1
    assert c.syncs == 2  # .item() (an aten call) and .tolist() (none on the CPU)
    assert c.work == 4  # ones, zeros, the output's empty_like, sum
    assert c.aten == 8  # those four, three views (view, t, view) and .item()
