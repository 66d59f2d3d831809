"""DeBERTa-v2 / v3 beside transformers' classes, past what tests/model/test_families.py runs for
every family (each class's outputs and gradients, checkpoints both ways, int8, partial checkpoints):
the configurations deberta checkpoints use (without buckets, separate position projections, one
position term), distances past the buckets and past max_relative_positions, left padding, the
probabilities, the multiple-choice head, the newer MLM head, and Korean text through an
mdeberta-shaped model."""
import pytest
import torch

import fastbert
from tests.helpers.backends import require
from tests.helpers.bert import TOL, compare
from tests.helpers.families import CONFIGS, batch
from tests.helpers.st_dirs import KOREAN, unigram_tokenizer

transformers = pytest.importorskip("transformers")

VARIANTS = {
    "v3": {},
    "no buckets": dict(position_buckets=-1, max_relative_positions=24),
    "own position projections": dict(share_att_key=False),
    "c2p only": dict(pos_att_type="c2p"),
    "no relative attention, absolute positions": dict(relative_attention=False, position_biased_input=True,
                                                      type_vocab_size=2),
}


def pair(name, seed=0, **overrides):
    torch.manual_seed(seed)
    hc = transformers.DebertaV2Config(**dict(CONFIGS["deberta-v2"], **overrides))
    hm = getattr(transformers, name)(hc).eval()
    fm = getattr(fastbert, name)(fastbert.DebertaV2Config(**hc.to_dict())).eval()
    fm.load_transformers_state_dict(hm.state_dict())
    return hm, fm


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_configuration_outputs_and_gradients(variant):
    """Sequences of 90 tokens: distances past the 16 buckets' linear range and past
    max_relative_positions (64; 24 without buckets), which clamp to the tables' last rows."""
    hm, fm = pair("DebertaV2ForMaskedLM", **VARIANTS[variant])
    g = torch.Generator().manual_seed(1)
    ids, mask, tt = batch("deberta-v2", 3, 90, g)
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & mask.bool(), ids, torch.full_like(ids, -100))
    compare(variant, hm, fm, ids, mask, None if VARIANTS[variant].get("type_vocab_size") is None else tt,
            dict(labels=labels), torch.float32)


@pytest.mark.triton
def test_the_triton_kernels_in_half_precision():
    """The model on the Triton backend in float16 (the disentangled attention's kernels take 16-bit
    inputs; the interpreter here), packed rows, against transformers in float16: outputs and every
    gradient."""
    require("triton")
    hm, fm = pair("DebertaV2Model")
    hm, fm = hm.half(), fm.half().set_backend("triton")
    g = torch.Generator().manual_seed(2)
    ids, mask, _ = batch("deberta-v2", 3, 40, g)
    compare("triton fp16", hm, fm, ids, mask, None, {}, torch.float16)


def test_left_padding_and_the_probabilities():
    """Left padding gives the same real-token states as transformers (the terms read i - j, which the
    padding does not change); output_attentions gives transformers' probabilities at real queries."""
    hm, fm = pair("DebertaV2Model")
    ids = torch.tensor([[0, 0, 0, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10, 11]])
    mask = (ids != 0).long()
    with torch.no_grad():
        want = hm(ids, attention_mask=mask, output_attentions=True)
        got = fm(ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real], **TOL[torch.float32])
    for a, b in zip(got.attentions, want.attentions):
        torch.testing.assert_close(a.permute(0, 2, 1, 3)[real], b.permute(0, 2, 1, 3)[real], **TOL[torch.float32])


def test_multiple_choice_and_the_newer_mlm_head():
    hm, fm = pair("DebertaV2ForMultipleChoice")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 120, (2, 3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 2, 7:] = 0
    labels = torch.tensor([2, 0])
    hout, fout = hm(ids, attention_mask=mask, labels=labels), fm(ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(fout.logits, hout.logits, **TOL[torch.float32])
    torch.testing.assert_close(fout.loss, hout.loss, **TOL[torch.float32])
    hout.loss.backward()
    fout.loss.backward()
    theirs = dict(hm.named_parameters())
    for name, p in fm.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, atol=1e-5, rtol=1e-4, msg=name)

    hm, fm = pair("DebertaV2ForMaskedLM", legacy=False)
    assert hasattr(fm, "lm_predictions") and not hasattr(fm, "cls")
    ids, mask, _ = batch("deberta-v2", 3, 20, g)
    compare("lm_predictions", hm, fm, ids, mask, None, {}, torch.float32)


def test_korean_text_through_an_mdeberta_shaped_model(tmp_path):
    """mdeberta-v3-base's structure on a Unigram tokenizer trained on Korean text: a sequence
    classifier (an NLI head) from transformers' files, against transformers, fp32 and int8."""
    tok = unigram_tokenizer()
    cfg = transformers.DebertaV2Config(**dict(CONFIGS["deberta-v2"], vocab_size=len(tok),
                                              pad_token_id=tok.pad_token_id, num_labels=3, initializer_range=0.1))
    torch.manual_seed(0)
    transformers.DebertaV2ForSequenceClassification(cfg).eval().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    enc = tok(KOREAN[:12], padding=True, return_tensors="pt")
    assert tok.unk_token_id not in enc["input_ids"][enc["attention_mask"].bool()]
    hm = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    fm = fastbert.AutoModelForSequenceClassification.from_pretrained(str(tmp_path))
    q8 = fastbert.AutoModelForSequenceClassification.from_pretrained(str(tmp_path), quantize="int8")
    assert type(fm) is fastbert.DebertaV2ForSequenceClassification
    with torch.no_grad():
        want, got, int8 = (m(**enc).logits for m in (hm, fm, q8))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert torch.nn.functional.cosine_similarity(int8, want, dim=-1).min() > 0.99


def test_unsupported_configurations_are_clear_errors():
    with pytest.raises(ValueError, match="conv_kernel_size 3 .* is not supported"):
        fastbert.DebertaV2Config(**dict(CONFIGS["deberta-v2"], conv_kernel_size=3))
    with pytest.raises(ValueError, match=r"pos_att_type \['p2p'\] is not supported"):
        fastbert.DebertaV2Config(**dict(CONFIGS["deberta-v2"], pos_att_type="p2p"))
