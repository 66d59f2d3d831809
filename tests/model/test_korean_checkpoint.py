"""A Korean BERT checkpoint in transformers' format, shaped like KLUE's bert-base (vocabulary of
32000 with Hangul syllables and "##" pieces, cased: do_lower_case false, [PAD] [UNK] [CLS] [SEP]
[MASK] as ids 0-4), with random weights: fastbert loads the model and the tokenizer and gives
transformers' ids and hidden states on Korean text."""
import json

import torch

import fastbert
from fastbert.data import vocab as vocab_mod

SENTENCES = ["버트는 문장의 앞뒤 문맥을 함께 읽는다.", "KLUE 데이터로 미세 조정한 모델", "서울에서 부산까지 기차로 갔다."]


def _klue_like_vocab(size=32000):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "!", ".", ",", "?"]
    vocab += [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab += ["버트", "문장", "문맥", "함께", "서울", "부산", "기차", "데이터", "모델"]
    syllables = [chr(c) for c in range(0xAC00, 0xD7A4)]
    for s in syllables:
        vocab += [s, "##" + s]
        if len(vocab) >= size:
            break
    return vocab[:size]


def test_klue_shaped_checkpoint_loads_with_its_tokenizer(tmp_path):
    import transformers

    vocab = _klue_like_vocab()
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": False, "strip_accents": None, "tokenize_chinese_chars": True, "model_max_length": 512,
         "tokenizer_class": "BertTokenizer", "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
         "cls_token": "[CLS]", "mask_token": "[MASK]"}), encoding="utf-8")
    cfg = transformers.BertConfig(vocab_size=32000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, pad_token_id=0)
    torch.manual_seed(0)
    transformers.BertModel(cfg).eval().save_pretrained(str(tmp_path))

    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = vocab_mod.load_tokenizer(str(tmp_path))
    assert not vocab_mod.is_lowercase(ours) and vocab_mod.accent_form(ours) is False
    assert vocab_mod.special_token_ids(ours) == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    batch = theirs(SENTENCES, padding=True, return_tensors="pt")
    for s, row, mask in zip(SENTENCES, batch["input_ids"], batch["attention_mask"]):
        assert [2, *ours.encode(s).ids, 3] == row[mask.bool()].tolist(), s
    assert ours.normalizer.normalize_str("KLUE 한국어") == "KLUE 한국어"  # cased, Hangul whole
    assert ours.encode("K a").ids == theirs("K a", add_special_tokens=False)["input_ids"] == [vocab.index("K"), vocab.index("a")]

    model = fastbert.BertModel.from_pretrained(str(tmp_path))
    ref = transformers.BertModel.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        got = model(**batch).last_hidden_state
        want = ref(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-4)
