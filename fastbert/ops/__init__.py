"""The public functional ops of fastbert. Each runs on one of three backends ("triton", "cpp",
"torch"; backend=None picks by device, see fastbert.backend) and is a torch.library custom op, so
torch.compile traces models that use them without graph breaks."""
from fastbert.ops.attention import attention, varlen_attention
from fastbert.ops.attention_weights import attention_weights
from fastbert.ops.bias_gelu import bias_gelu
from fastbert.ops.disentangled_attention import disentangled_attention, varlen_disentangled_attention
from fastbert.ops.embedding import embedding
from fastbert.ops.encoder import LayerWeights, encoder_layer
from fastbert.ops.geglu import geglu, swiglu
from fastbert.ops.int8 import (
    int8_add_layer_norm,
    int8_bias_gelu,
    int8_dequantize,
    int8_glu,
    int8_matmul,
    pack_int8_weight,
    quantize_rows,
    quantize_weight,
    unpack_int8_weight,
)
from fastbert.ops.layer_norm import MAX_HIDDEN, add_layer_norm, add_rms_norm
from fastbert.ops.linear import linear
from fastbert.ops.padding import pad, unpad

__all__ = [
    "attention", "varlen_attention", "disentangled_attention", "varlen_disentangled_attention", "attention_weights",
    "unpad", "pad", "bias_gelu", "geglu", "swiglu", "add_layer_norm", "add_rms_norm", "linear",
    "embedding", "MAX_HIDDEN", "quantize_rows", "quantize_weight", "pack_int8_weight", "unpack_int8_weight",
    "int8_matmul", "int8_dequantize", "int8_bias_gelu", "int8_glu", "int8_add_layer_norm", "encoder_layer", "LayerWeights",
]
