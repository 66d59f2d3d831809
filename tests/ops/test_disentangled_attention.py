"""fastbert.ops.disentangled_attention (DeBERTa's): the rows its position terms read against
transformers' relative positions, the op against transformers' attention module on the same
projections, dropout by seed, and its input errors."""
import pytest
import torch

from fastbert.layouts import deberta_position_rows
from fastbert.ops.disentangled_attention import disentangled_attention
from fastbert.reference.disentangled_attention import position_rows_matrix

transformers = pytest.importorskip("transformers")
deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")


@pytest.mark.parametrize("seq,buckets,furthest", [(700, 256, 512), (40, 8, 64), (300, 16, 64), (30, -1, 16)])
def test_position_rows_are_transformers_relative_positions(seq, buckets, furthest):
    x = torch.zeros(1, seq, 4)
    span = buckets if buckets > 0 else furthest
    want = (deberta.build_relative_position(x, x, bucket_size=buckets, max_position=furthest)[0] + span)
    want = want.clamp(0, 2 * span - 1)
    assert torch.equal(position_rows_matrix(seq, buckets, furthest), want)
    assert deberta_position_rows(seq, buckets, furthest).shape == (2 * seq - 1,)


@pytest.mark.parametrize("terms", ["p2c|c2p", "c2p", "p2c"])
def test_against_transformers_attention_module(terms):
    cfg = transformers.DebertaV2Config(hidden_size=32, num_attention_heads=2, relative_attention=True,
                                       position_buckets=8, max_relative_positions=32, pos_att_type=terms,
                                       share_att_key=True, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    torch.manual_seed(0)
    module = deberta.DisentangledSelfAttention(cfg).eval()
    g = torch.Generator().manual_seed(1)
    hidden, rel = torch.randn(2, 21, 32, generator=g), torch.randn(16, 32, generator=g)
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[1, 13:] = 0
    ext = mask[:, None, None, :] * mask[:, None, :, None]
    with torch.no_grad():
        want = module(hidden, ext, rel_embeddings=rel)[0]

        def heads(t):
            return t.view(*t.shape[:-1], 2, 16).transpose(-3, -2)

        q, k, v = heads(module.query_proj(hidden)), heads(module.key_proj(hidden)), heads(module.value_proj(hidden))
        pk, pq = heads(module.key_proj(rel)), heads(module.query_proj(rel))
        got = disentangled_attention(q, k, v, mask, pos_key=pk if "c2p" in terms else None,
                                     pos_query=pq if "p2c" in terms else None, position_buckets=8,
                                     max_relative_positions=32)
    real = mask.bool()
    torch.testing.assert_close(got.transpose(1, 2).reshape(2, 21, 32)[real], want[real], atol=1e-6, rtol=1e-5)


def test_dropout_is_a_function_of_the_seed():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=g) for _ in range(3))
    pk = torch.randn(2, 16, 8, generator=g)
    kw = dict(pos_key=pk, position_buckets=8, max_relative_positions=16)
    a, b = (disentangled_attention(q, k, v, dropout_p=0.3, seed=7, **kw) for _ in range(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, disentangled_attention(q, k, v, dropout_p=0.3, seed=8, **kw))
    assert not torch.equal(a, disentangled_attention(q, k, v, **kw))


def test_input_errors():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"pos_key must be \[heads, 2 span, head_dim\] = \(2, 16, 8\)"):
        disentangled_attention(q, q, q, pos_key=torch.randn(2, 10, 8), position_buckets=8)
    with pytest.raises(ValueError, match="attention_mask must be"):
        disentangled_attention(q, q, q, torch.ones(1, 4))
    with pytest.raises(ValueError, match="q, k and v must be"):
        disentangled_attention(q, q[..., :4], q)
    with pytest.raises(ValueError, match="unknown backend"):
        disentangled_attention(q, q, q, backend="cuda")
