"""Korean text through the families Korean users deploy: a KLUE-style RoBERTa (a WordPiece vocabulary
of Hangul syllables, model_type "roberta", one token type), XLM-R with a Unigram tokenizer and
gte-multilingual-reranker-base's shape (GTE on XLM-R's tokenizer), each against transformers on the
same tokenized Korean sentences, in fp32 and int8."""
import pytest
import torch

import fastbert
from fastbert.data.vocab import train_wordpiece
from tests.helpers.st_dirs import KOREAN, unigram_tokenizer, xlmr_checkpoint

transformers = pytest.importorskip("transformers")


def klue_style_checkpoint(directory):
    """A RoBERTa sequence classifier with a cased WordPiece vocabulary trained on Korean text."""
    tok = train_wordpiece(KOREAN * 4, 400, lowercase=False)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                  cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    assert any(len(t) == 1 and "가" <= t <= "힣" for t in hf_tok.get_vocab())  # Hangul syllables
    cfg = transformers.RobertaConfig(vocab_size=len(hf_tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=514, type_vocab_size=1,
                                     pad_token_id=hf_tok.pad_token_id, num_labels=3, initializer_range=0.1)
    torch.manual_seed(0)
    transformers.RobertaForSequenceClassification(cfg).eval().save_pretrained(directory)
    hf_tok.save_pretrained(directory)
    return str(directory)


def gte_multilingual_checkpoint(directory):
    """A GTE sequence classifier (one token type, rotary base 160000) on an XLM-R-style Unigram tokenizer."""
    tok = unigram_tokenizer()
    cfg = transformers.GteConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=128, type_vocab_size=1, pad_token_id=tok.pad_token_id, num_labels=3,
                                 initializer_range=0.1)
    torch.manual_seed(0)
    transformers.GteForSequenceClassification(cfg).eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


@pytest.mark.parametrize("kind", ["klue-roberta", "xlm-roberta", "gte-multilingual"])
def test_korean_sentences_match_transformers(tmp_path, kind):
    if kind == "klue-roberta":
        path = klue_style_checkpoint(tmp_path / "m")
    elif kind == "gte-multilingual":
        path = gte_multilingual_checkpoint(tmp_path / "m")
    else:
        path = xlmr_checkpoint(tmp_path / "m", head="XLMRobertaForSequenceClassification", num_labels=3,
                               initializer_range=0.1)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok(KOREAN[:12], padding=True, return_tensors="pt")
    enc.pop("token_type_ids", None)
    assert tok.unk_token_id not in enc["input_ids"][enc["attention_mask"].bool()]
    hm = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    fm = fastbert.AutoModelForSequenceClassification.from_pretrained(path)
    q8 = fastbert.AutoModelForSequenceClassification.from_pretrained(path, quantize="int8")
    with torch.no_grad():
        want = hm(**enc, output_hidden_states=True)
        got = fm(**enc, output_hidden_states=True)
        int8 = q8(**enc).logits
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(got.logits, want.logits, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.hidden_states[-1][real], want.hidden_states[-1][real], atol=2e-5, rtol=1e-4)
    assert torch.nn.functional.cosine_similarity(int8, want.logits, dim=-1).min() > 0.99
