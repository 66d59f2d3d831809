"""mmBERT (multilingual ModernBERT: ModernBERT's architecture with mmBERT-base's configuration, a
256,000-token vocabulary and rotary base 160,000 in the local layers as in the global ones) on
fastbert against transformers' ModernBERT classes, fp32: the masked-LM logits over the whole
vocabulary and the base model's last hidden state at real tokens, at mmBERT-base's widths and real
vocabulary with 3 of its 22 layers (one global, two sliding), on sequences longer than the window
and longer than the distance at which the two rotary bases part; the tied embeddings through
checkpoints both ways; the hub's and transformers 5's config forms.

The 256,000 x 768 embedding is 786 MB in fp32: transformers' model is built once for the module,
and fastbert's models share its tensors (built on the meta device, loaded with assign=True)."""
import gc
import json
from types import SimpleNamespace

import pytest
import torch

import fastbert
from tests.helpers.backends import require
from tests.helpers.modernbert import check_close, randomize

transformers = pytest.importorskip("transformers")

LAYERS = 3  # full, sliding, sliding: both rotary layer types and the window
LENGTHS = (150, 90)  # right padding; both longer than the 64-token half-window


def mmbert_config(**overrides):
    """transformers' ModernBertConfig for mmBERT-base (jhu-clsp/mmBERT-base): ModernBERT-base's
    widths with a 256,000-token vocabulary, both rotary bases 160,000, its special token ids, mean
    pooling. ModernBERT-base's own is transformers.ModernBertConfig() (its defaults)."""
    return transformers.ModernBertConfig(**{**mmbert_hub_dict(), **overrides})


def mmbert_hub_dict():
    """mmBERT-base's config.json in the form the hub's checkpoints were written in (before
    transformers 5): global_rope_theta / local_rope_theta and global_attn_every_n_layers, no
    layer_types or rope_parameters."""
    return dict(model_type="modernbert", architectures=["ModernBertForMaskedLM"], hidden_size=768,
                num_attention_heads=12, num_hidden_layers=22, intermediate_size=1152, vocab_size=256000,
                global_rope_theta=160000.0, local_rope_theta=160000.0, local_attention=128,
                global_attn_every_n_layers=3, max_position_embeddings=8192, norm_bias=False, norm_eps=1e-5,
                layer_norm_eps=1e-5, pad_token_id=0, cls_token_id=1, sep_token_id=1, eos_token_id=1, bos_token_id=2,
                mask_token_id=4, tie_word_embeddings=True, classifier_pooling="mean", hidden_activation="gelu",
                attention_bias=False, mlp_bias=False, decoder_bias=True)


@pytest.fixture(scope="module")
def models():
    """transformers' ModernBertForMaskedLM at mmBERT-base's size with LAYERS layers (random weights,
    eval, sdpa), and fastbert's ModernBertForMaskedLM and ModernBertModel on the same tensors (no
    copies); freed after the module."""
    from transformers.initialization import no_init_weights

    hc = mmbert_config(num_hidden_layers=LAYERS, attn_implementation="sdpa")
    with no_init_weights():  # every weight is drawn below
        hm = transformers.ModernBertForMaskedLM(hc).eval()
    hm.tie_weights()  # (no_init_weights skips the tying too)
    assert hm.decoder.weight is hm.model.embeddings.tok_embeddings.weight
    randomize(hm, 21, scale=0.02)
    config = fastbert.ModernBertConfig(**hc.to_dict())
    with torch.device("meta"):
        mlm, base = fastbert.ModernBertForMaskedLM(config), fastbert.ModernBertModel(config)
    mlm.load_state_dict(hm.state_dict(), strict=True, assign=True)
    mlm.tie_weights()  # assign=True loaded the two names as two Parameters of one tensor
    base.load_state_dict(hm.model.state_dict(), strict=True, assign=True)
    yield SimpleNamespace(hm=hm, mlm=mlm.eval(), base=base.eval())
    del hm, mlm, base
    gc.collect()


def batch(seed, lengths=LENGTHS):
    """(input_ids, attention_mask): [CLS] (1) ... [SEP] (1) per row, ids from the whole vocabulary,
    padding 0 on the right."""
    g = torch.Generator().manual_seed(seed)
    seq = max(lengths)
    ids = torch.randint(5, 256000, (len(lengths), seq), generator=g)
    mask = (torch.arange(seq)[None] < torch.tensor(lengths)[:, None]).long()
    for row, n in enumerate(lengths):
        ids[row, 0] = ids[row, n - 1] = 1
    return ids.masked_fill(mask == 0, 0), mask


def test_the_config_is_mmbert_base():
    hc = mmbert_config()
    ours = fastbert.ModernBertConfig(**hc.to_dict())
    for c in (hc, ours):
        assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (256000, 768, 1152, 22)
        assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention"] * 7 + ["full_attention"]
        assert c.sliding_window == 64 and c.tie_word_embeddings and c.classifier_pooling == "mean"
        assert (c.pad_token_id, c.cls_token_id, c.sep_token_id, c.bos_token_id) == (0, 1, 1, 2)
    assert [ours.rope_theta(t) for t in ("full_attention", "sliding_attention")] == [160000.0, 160000.0]
    assert hc.rope_parameters["sliding_attention"]["rope_theta"] == 160000.0


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["cpp", "torch"])
def test_masked_lm_matches_transformers(models, backend_name):
    """Logits over the 256,000-token vocabulary at every real token, and the loss."""
    require(backend_name)
    models.mlm.set_backend(backend_name)
    ids, mask = batch(1)
    labels = torch.where((torch.arange(ids.shape[1]) % 7 == 3) & (mask == 1), ids, -100)
    real = mask.bool()
    with torch.no_grad():
        ours = models.mlm(input_ids=ids, attention_mask=mask, labels=labels)
        theirs = models.hm(input_ids=ids, attention_mask=mask, labels=labels)
        assert ours.logits.shape == theirs.logits.shape == (2, 150, 256000)
        errors = {}
        check_close(errors, "logits", ours.logits[real], theirs.logits[real])
        check_close(errors, "loss", ours.loss, theirs.loss)
    del ours, theirs
    print(f"mmBERT ModernBertForMaskedLM ({backend_name}): max abs error {errors}")


@pytest.mark.parametrize("backend_name", ["cpp", "torch"])
def test_model_matches_transformers(models, backend_name):
    """The base model, packed (padded batch) and padded (no padding): last_hidden_state at real tokens."""
    require(backend_name)
    models.base.set_backend(backend_name)
    errors = {}
    for tag, lengths in (("padded batch", LENGTHS), ("no padding", (150, 150))):
        ids, mask = batch(2, lengths)
        with torch.no_grad():
            got = models.base(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
            want = models.hm.model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        check_close(errors, f"last_hidden_state ({tag})", got, want)
    print(f"mmBERT ModernBertModel ({backend_name}): max abs error {errors}")


def test_the_local_rotary_base_matters_here(models):
    """The parity above would catch a local base read as ModernBERT-base's 10,000: at these lengths
    the sliding layers' output moves far beyond the tolerance with it."""
    ids, mask = batch(3)
    real = mask.bool()
    sliding = [layer.attn for layer in models.base.layers if layer.attention_type == "sliding_attention"]
    assert len(sliding) == 2 and all(a.rope_theta == 160000.0 and a.window == 64 for a in sliding)
    with torch.no_grad():
        want = models.hm.model(input_ids=ids, attention_mask=mask).last_hidden_state[real]
        try:
            for a in sliding:
                a.rope_theta = 10000.0
            got = models.base(input_ids=ids, attention_mask=mask).last_hidden_state[real]
        finally:
            for a in sliding:
                a.rope_theta = 160000.0
    assert (got - want).abs().max() > 100 * 1e-4 * want.abs().max()  # 100 x what parity allows


def _tensor_names(directory):
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.slow
def test_tied_embeddings_stay_tied_through_checkpoints_both_ways(models, tmp_path):
    """transformers' save -> fastbert's from_pretrained: the decoder is the embedding Parameter;
    fastbert's save writes it once (as transformers does) -> transformers' from_pretrained: nothing
    missing, the decoder tied again; the same weights and logits all the way."""
    hm = models.hm
    embedding = hm.model.embeddings.tok_embeddings.weight
    hm.save_pretrained(tmp_path / "hf")
    ours = fastbert.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "hf"))
    assert ours.decoder.weight is ours.model.embeddings.tok_embeddings.weight
    assert torch.equal(ours.decoder.weight, embedding)
    ids, mask = batch(4, (12,))
    with torch.no_grad():
        want = hm(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(ours(input_ids=ids, attention_mask=mask).logits, want, rtol=1e-4, atol=1e-5)
    ours.save_pretrained(str(tmp_path / "fb"))
    del ours
    gc.collect()
    assert "decoder.weight" not in _tensor_names(tmp_path / "fb")
    assert "model.embeddings.tok_embeddings.weight" in _tensor_names(tmp_path / "fb")
    assert json.loads((tmp_path / "fb" / "config.json").read_text())["tie_word_embeddings"] is True
    back, info = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "fb"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert back.decoder.weight.data_ptr() == back.model.embeddings.tok_embeddings.weight.data_ptr()
    assert torch.equal(back.decoder.weight, embedding)
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(input_ids=ids, attention_mask=mask).logits, want, rtol=1e-4, atol=1e-5)
    del back
    gc.collect()


def test_both_config_forms_give_the_same_rope_bases(tmp_path):
    """mmBERT's config.json as the hub holds it (global_rope_theta / local_rope_theta) and as
    transformers 5 writes it (layer_types, rope_parameters) give fastbert and transformers the same
    layer types, window and rotary bases (160,000 both), and fastbert's layers run with them; a
    config fastbert saves reads back the same in transformers."""
    hub = mmbert_hub_dict()
    forms = {"hub": hub, "transformers 5": mmbert_config().to_dict()}
    assert "rope_parameters" not in hub and "global_rope_theta" not in forms["transformers 5"]
    assert "rope_parameters" in forms["transformers 5"] and "layer_types" in forms["transformers 5"]
    read = {}
    for form, d in forms.items():
        (tmp_path / form).mkdir()
        (tmp_path / form / "config.json").write_text(json.dumps(d))
        ours = fastbert.AutoConfig.from_pretrained(str(tmp_path / form))
        theirs = transformers.AutoConfig.from_pretrained(str(tmp_path / form))
        assert isinstance(ours, fastbert.ModernBertConfig) and ours.layer_types == theirs.layer_types
        assert ours.sliding_window == theirs.sliding_window == 64
        read[form] = {t: (ours.rope_theta(t), theirs.rope_parameters[t]["rope_theta"]) for t in ours.LAYER_TYPES}
        with torch.device("meta"):  # the layers' own bases, as the kernels get them (no weights allocated)
            model = fastbert.ModernBertModel(fastbert.ModernBertConfig(**dict(ours.to_dict(), num_hidden_layers=4,
                                                                              layer_types=None)))
        assert [layer.attn.rope_theta for layer in model.layers] == [160000.0] * 4
        ours.save_pretrained(str(tmp_path / form / "saved"))
        again = transformers.AutoConfig.from_pretrained(str(tmp_path / form / "saved"))
        assert {t: again.rope_parameters[t]["rope_theta"] for t in ours.LAYER_TYPES} == {t: 160000.0 for t in read[form]}
    assert read["hub"] == read["transformers 5"] == {t: (160000.0, 160000.0) for t in read["hub"]}

