"""Plain PyTorch reference layers: the ground truth every kernel is tested against, one file per
op (bias_gelu, geglu, layer_norm, attention, masking) and the Philox generator they share (philox).

They are written for clarity, not speed, and they are also the "torch" backend of fastbert.ops.
"""
from fastbert.reference.attention import (
    MAX_DROPOUT_SEQLEN,
    Attention,
    attention,
    attention_dropout_offsets,
    attention_keep_mask,
    mask_starts,
    varlen_attention,
    window_band,
)
from fastbert.reference.bias_gelu import BiasGelu, bias_gelu
from fastbert.reference.disentangled_attention import disentangled_attention
from fastbert.reference.geglu import GeGLU, geglu, swiglu
from fastbert.reference.layer_norm import AddLayerNorm, add_layer_norm, add_rms_norm
from fastbert.reference.masking import (
    MLM_IGNORE_INDEX,
    MLM_SELECTIONS,
    MLM_STREAM_KEY,
    MLM_STREAM_OUTCOME,
    MLM_STREAM_RANDOM,
    mask_tokens,
    mlm_draws,
    mlm_prediction_count,
    mlm_units,
    mlm_walk,
    word_start_table,
    word_starts,
)
from fastbert.reference.philox import (
    check_seed,
    dropout_keep_mask,
    dropout_threshold,
    new_seed,
    philox_uint32,
)
from fastbert.reference.rotary import rotary_tables, rotate, rotate_packed

__all__ = [
    "check_seed", "dropout_keep_mask", "dropout_threshold", "new_seed", "philox_uint32",
    "bias_gelu", "BiasGelu", "geglu", "GeGLU", "swiglu", "add_layer_norm", "add_rms_norm", "AddLayerNorm", "rotary_tables",
    "rotate", "rotate_packed",
    "attention", "varlen_attention", "Attention", "window_band", "attention_dropout_offsets", "attention_keep_mask",
    "mask_starts", "disentangled_attention",
    "MAX_DROPOUT_SEQLEN", "mask_tokens", "mlm_draws", "mlm_prediction_count", "mlm_units", "mlm_walk",
    "word_start_table", "word_starts", "MLM_IGNORE_INDEX", "MLM_SELECTIONS",
    "MLM_STREAM_KEY", "MLM_STREAM_OUTCOME", "MLM_STREAM_RANDOM",
]
