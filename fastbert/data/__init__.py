"""Pretraining data, from raw text to masked batches:

    corpus.py              text files -> documents of sentences (two layouts; bad lines counted and skipped)
    default_corpus.py      the built-in corpus: the standard library's pydoc_data.topics
    vocab.py               WordPiece vocabularies with `tokenizers`: train one, or load vocab.txt / tokenizer.json
    instances.py           sentence pairs after BERT's create_pretraining_data recipe
    pretraining_shards.py  pairs on disk: memory-mapped numpy shards and an index
    prepare.py             `fastbert prepare`: all of the above
    collator.py            tokenized sentence pairs -> padded or packed MLM + NSP batches (masking: fastbert.masking)
"""
from fastbert.data.collator import BERT_SPECIAL_TOKENS, PretrainingCollator

__all__ = ["PretrainingCollator", "BERT_SPECIAL_TOKENS"]
