"""The floating dtypes fastbert runs in and their short names ("fp32", "fp16", "bf16"): the one
table that command-line options, benchmark tags and autocast settings read."""
from __future__ import annotations

from typing import Union

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


# int8 inference (quantize="int8"): a tag of benchmark rows, not a dtype to run a float model in
QUANTIZED = {"int8": torch.int8}


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a dtype: torch.bfloat16 -> "bf16" (torch.int8 -> "int8", the quantized runs)."""
    for name, d in {**DTYPES, **QUANTIZED}.items():
        if d == dtype:
            return name
    raise ValueError(f"fastbert: dtype {dtype} is not one of {sorted(DTYPES)}")


def parse_dtype(value: Union[str, torch.dtype]) -> torch.dtype:
    """A dtype from its short name, its torch name ("bfloat16", "torch.bfloat16") or itself."""
    if isinstance(value, torch.dtype):
        dtype_name(value)
        return value
    key = str(value).strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        names = ", ".join(list(DTYPES) + list(_ALIASES))
        raise ValueError(f"fastbert: unknown dtype {value!r}; choose one of {names}")
    return DTYPES[key]
