"""The public functional ops of fastbert. Each runs on one of three backends ("triton", "cpp",
"torch"; backend=None picks by device, see fastbert.backend) and is a torch.library custom op, so
torch.compile traces models that use them without graph breaks."""
from fastbert.ops.attention import attention, varlen_attention
from fastbert.ops.attention_weights import attention_weights
from fastbert.ops.bias_gelu import bias_gelu
from fastbert.ops.embedding import embedding
from fastbert.ops.layer_norm import MAX_HIDDEN, add_layer_norm
from fastbert.ops.linear import linear
from fastbert.ops.padding import pad, unpad

__all__ = [
    "attention", "varlen_attention", "attention_weights", "unpad", "pad", "bias_gelu", "add_layer_norm", "linear",
    "embedding", "MAX_HIDDEN",
]
