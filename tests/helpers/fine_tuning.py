"""A toy sentiment task for transformers.Trainer: its words and their tokenizer, a tiny model size
and labelled rows."""
import random

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "movie", "was", "a", "plot", "and", "very", "not"]
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)


def sentiment_tokenizer():
    """A BERT WordPiece tokenizer whose vocabulary is the special tokens and WORDS."""
    import transformers

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    return transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)})


def sentiment_rows(tokenizer, n, seed):
    """Sentences of 3..12 words; label 1 when a positive word comes before any negative one."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS[6:]) for _ in range(rng.randint(2, 11))]
        label = rng.randint(0, 1)
        words.insert(rng.randint(0, len(words)), rng.choice(WORDS[:3] if label else WORDS[3:6]))
        rows.append(dict(tokenizer(" ".join(words)), label=label))
    return rows
