"""MLM token masking, the public front: see fastbert.ops.masking for the rule and its checks."""
from fastbert.ops.masking import (  # noqa: F401
    IGNORE_INDEX,
    draw_seed,
    mask_tokens,
    vocab_tokens,
    word_start_table,
    word_starts,
)

__all__ = ["mask_tokens", "word_start_table", "word_starts", "draw_seed", "IGNORE_INDEX"]
