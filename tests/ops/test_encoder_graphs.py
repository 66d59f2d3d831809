"""fastbert.ops.encoder's CUDA graphs: the buckets, the packing and the static buffers run on the CPU
(EncoderGraphs(capture=False) takes every step of a replay but the graph itself), against the
model's eager forward; the capture and replay themselves on a GPU."""
import pytest
import torch

import fastbert
from fastbert.ops import encoder
from tests.helpers.backends import device_for, require

SMALL = dict(hidden_size=64, num_attention_heads=4, intermediate_size=96, num_hidden_layers=2, vocab_size=120)


def test_buckets_pad_by_at_most_half_again():
    got = [encoder.bucket(n, 64) for n in (1, 64, 65, 96, 97, 128, 129, 200, 1000)]
    assert got == [64, 64, 96, 96, 128, 128, 192, 256, 1024]
    assert [encoder.bucket(n, 1) for n in range(1, 10)] == [1, 2, 3, 4, 6, 6, 8, 8, 12]
    for n in range(1, 5000):
        b = encoder.bucket(n, 16)
        assert n <= b and (b <= 16 or b < 1.5 * n + 1), n


def test_packing_takes_the_real_tokens_in_unpad_order():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [10, 11, 12, 13]])
    mask = (ids != 0).long()
    types = torch.tensor([[0, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]])
    positions = torch.arange(4).expand(3, 4)
    p = encoder.pack_inputs(ids, types, positions, mask)
    assert p.ids.tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert p.types.tolist() == [0, 0, 1, 0, 1, 1, 1, 1, 1]
    assert p.positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert p.cu_seqlens.tolist() == [0, 3, 5, 9] and p.longest == 4 and p.shape == (3, 4)
    assert p.key == (64, 3, 16)
    whole = encoder.pack_inputs(ids, None, None, None)
    assert whole.ids.numel() == 12 and whole.types is None and whole.cu_seqlens.tolist() == [0, 4, 8, 12]


def model_and_batches(family, backend):
    torch.manual_seed(0)
    if family == "modernbert":
        from tests.helpers import modernbert as mb

        _, model = mb.pair("ModernBertModel", seed=1, backend=backend, num_hidden_layers=2)
    else:
        import transformers

        cls = {"bert": "BertModel", "roberta": "RobertaModel", "mpnet": "MPNetModel"}[family]
        config = getattr(transformers, cls.replace("Model", "Config"))(**SMALL, pad_token_id=1)
        model = getattr(fastbert, cls)(getattr(fastbert, cls.replace("Model", "Config"))(**config.to_dict()))
        model = model.eval().set_backend(backend)
    g = torch.Generator().manual_seed(2)
    batches = []
    # the third runs in the first's buckets with fewer tokens (rows left from the first past its
    # own), the fifth in a batch bucket of 6 (one sequence empty)
    for lengths in ((9, 4, 1), (5, 16), (8, 3, 1), (7, 7, 7, 3), (6, 5, 4, 3, 2)):
        seq = max(lengths)
        ids = torch.randint(3, 100, (len(lengths), seq), generator=g)
        mask = (torch.arange(seq)[None] < torch.tensor(lengths)[:, None]).long()
        batches.append((ids.masked_fill(mask == 0, 1), mask))
    return model.to(device_for(backend)), batches


@pytest.mark.triton
@pytest.mark.parametrize("family", ["bert", *(pytest.param(f, marks=pytest.mark.slow)
                                             for f in ("roberta", "mpnet", "modernbert"))])
def test_the_bucketed_encoder_gives_the_eager_forward(family, monkeypatch):
    """Every step of a replay but the graph (the static buffers, their padding rows in no sequence
    and the empty sequences, the LRU bound) through the model's forward on the Triton kernels,
    against the eager forward: the real tokens within float rounding of it (the GEMMs run on more
    rows), zeros at padding."""
    backend = "triton"
    require(backend)
    model, batches = model_and_batches(family, backend)
    graphs = encoder.EncoderGraphs(model.packed_encode, max_graphs=2, capture=False)
    dev = device_for(backend)
    with torch.no_grad():
        for ids, mask in batches:
            ids, mask = ids.to(dev), mask.to(dev)
            want = model(ids, mask).last_hidden_state
            with monkeypatch.context() as patch:
                patch.setattr(type(model), "graphs_for", lambda self, input_ids: graphs)
                got = model(ids, mask).last_hidden_state
            assert got.shape == want.shape
            real = mask.bool()
            torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
            assert not got[~real].any()
            assert len(graphs) <= 2
    # the third batch ran in the first's bucket, so the fourth's dropped the second's, the fifth's the first's
    assert [k[1] for k in graphs.buckets] == [4, 6]


@pytest.mark.triton
def test_a_replaced_parameter_drops_the_graphs_and_any_mode_writes_the_buffers():
    require("triton")
    model, batches = model_and_batches("bert", "triton")
    graphs = encoder.EncoderGraphs(model.packed_encode, capture=False)
    def packed(i):
        ids, mask = batches[i]
        return encoder.pack_inputs(ids, torch.zeros_like(ids), torch.arange(ids.shape[1]).expand_as(ids), mask)

    with torch.no_grad():  # (the first forward joins the QKV weights: the graphs read the sources after it)
        graphs(packed(0), model.graph_sources)
        graphs(packed(0), model.graph_sources)
        assert len(graphs) == 1
    with torch.inference_mode():  # a bucket's buffers made here are written again under no_grad below
        graphs(packed(1), model.graph_sources)
    with torch.no_grad():
        graphs(packed(1), model.graph_sources)
        assert len(graphs) == 2
        sources = model.graph_sources()
        model.encoder.layer[0].output.dense.weight.mul_(2)  # in place: the graphs read the new values
        assert model.graph_sources() == sources
        model.encoder.layer[0].output.dense.weight = torch.nn.Parameter(torch.randn(64, 96))  # replaced
        assert model.graph_sources() != sources
        graphs(packed(0), model.graph_sources)
        assert len(graphs) == 1 and graphs.sources == model.graph_sources()


def test_cuda_graphs_is_a_switch_and_off_the_gpu_changes_nothing():
    model, batches = model_and_batches("bert", "cpp")
    ids, mask = batches[0]
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state
        assert model.cuda_graphs(max_graphs=4) is model and model.cuda_graph_limit == 4
        assert model.graphs_for(ids) is None  # CPU tensors: eager
        assert torch.equal(model(ids, mask).last_hidden_state, want)
    assert model.cuda_graphs(False).cuda_graph_limit == 0
    with pytest.raises(ValueError, match="max_graphs"):
        model.cuda_graphs(max_graphs=0)
    import copy
    import pickle

    model._cuda_graphs = encoder.EncoderGraphs(model.packed_encode, capture=False)
    assert copy.deepcopy(model)._cuda_graphs is None
    assert pickle.loads(pickle.dumps(model._cuda_graphs)) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="capturing a CUDA graph needs a GPU")
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_replay_gives_the_eager_bits_on_the_gpu(family):
    """Captured and replayed on a GPU: the eager forward's bits on the bucket's shapes, no host sync
    inside the replay, one graph per bucket."""
    model, batches = model_and_batches(family, "triton")
    model.cuda_graphs()
    with torch.no_grad():
        for ids, mask in batches:
            ids, mask = ids.cuda(), mask.cuda()
            got = model(ids, mask).last_hidden_state
            packed = encoder.pack_inputs(ids, torch.zeros_like(ids), torch.arange(ids.shape[1], device="cuda")
                                         .expand_as(ids), mask)
            eager = encoder.EncoderGraphs(model.packed_encode, capture=False)
            want = eager(packed, model.graph_sources)
            assert torch.equal(got, want)
            torch.cuda.set_sync_debug_mode("error")
            try:
                model._cuda_graphs.buckets[packed.key].graph.replay()
            finally:
                torch.cuda.set_sync_debug_mode(0)
    assert len(model._cuda_graphs) == 4
