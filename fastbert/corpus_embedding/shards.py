"""The output of `fastbert embed`: Parquet shards and a manifest, written so that a killed run
never leaves a partial shard that looks complete.

    DIR/part-00000.parquet, part-00001.parquet, ...   columns id, embedding (and scale for int8)
    DIR/manifest.json                                 the settings, the shards, whether the run finished

A shard is written to a temporary name and renamed when complete; the manifest (also replaced
whole) lists only renamed shards, each with the input positions it covers. A resumed run removes
whatever the manifest does not list and continues at the position after its last shard; on a
finished run it does nothing and rewrites nothing.

Embedding columns by --output-dtype:
    float32   embedding fixed_size_list<float32>[dim]
    int8      embedding fixed_size_list<int8>[dim] and scale float32: embedding * scale ~ the vector
              (each vector scaled so that its largest component is +-127)
    binary    embedding fixed_size_list<uint8>[dim / 8]: the signs, packed 8 to a byte, first
              dimension in the top bit (sentence-transformers' "ubinary")

and with --outputs (BGE-M3's heads, fastbert.token_outputs), whatever the output dtype:
    sparse    sparse_indices list<int64> (token ids, ascending) and sparse_values list<float32>
    colbert   colbert list<fixed_size_list<float32>[dim]>: the text's ColBERT vectors
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

from fastbert.files import read_json, write_json

MANIFEST = "manifest.json"
FORMAT = "fastbert-embeddings"
OUTPUT_DTYPES = ("float32", "int8", "binary")
OUTPUTS = ("dense", "sparse", "colbert")  # what a run may write (--outputs)


class OutputError(ValueError):
    """An output directory that cannot be written or resumed (a one-line message)."""


def shard_name(k: int) -> str:
    return f"part-{k:05d}.parquet"


def columns(ids: List, outputs: Dict[str, object], output_dtype: str) -> Dict[str, object]:
    """The shard's columns (pyarrow arrays) of ids and the texts' outputs (job.embed_records'):
    "dense", float32 embeddings [n, dim], in the output dtype; "sparse" and "colbert", each text's."""
    import pyarrow as pa

    out: Dict[str, object] = {"id": pa.array(ids)}
    if "dense" in outputs:
        out.update(_dense_columns(outputs["dense"], output_dtype))
    if "sparse" in outputs:
        out["sparse_indices"] = pa.array([ids_ for ids_, _ in outputs["sparse"]], pa.list_(pa.int64()))
        out["sparse_values"] = pa.array([w for _, w in outputs["sparse"]], pa.list_(pa.float32()))
    if "colbert" in outputs:
        vecs = outputs["colbert"]
        width = vecs[0].shape[1] if vecs else 0
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in vecs])]).astype(np.int32)
        flat = np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in vecs]) if vecs else np.zeros(0, np.float32)
        out["colbert"] = pa.ListArray.from_arrays(pa.array(offsets),
                                                  pa.FixedSizeListArray.from_arrays(pa.array(flat), width))
    return out


def outputs_of(table, names) -> Dict[str, object]:
    """columns()'s inverse for a float32 table: {output: the texts' values} of the outputs `names`."""
    out: Dict[str, object] = {}
    if "dense" in names:
        out["dense"] = _list_rows(table.column("embedding").combine_chunks())
    if "sparse" in names:
        out["sparse"] = [(np.asarray(i, np.int64), np.asarray(w, np.float32)) for i, w in
                         zip(table.column("sparse_indices").to_pylist(), table.column("sparse_values").to_pylist())]
    if "colbert" in names:
        col = table.column("colbert").combine_chunks()
        flat, offsets = _list_rows(col.flatten()), col.offsets.to_numpy()
        out["colbert"] = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    return out


def _list_rows(array) -> np.ndarray:
    """A fixed_size_list array (one chunk) as numpy [rows, its list size]."""
    return array.flatten().to_numpy(zero_copy_only=False).reshape(-1, array.type.list_size)


def _dense_columns(emb: np.ndarray, output_dtype: str) -> Dict[str, object]:
    import pyarrow as pa

    emb = np.ascontiguousarray(emb, dtype=np.float32)
    n, dim = emb.shape
    out: Dict[str, object] = {}
    if output_dtype == "float32":
        out["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim)
    elif output_dtype == "int8":
        peak = np.abs(emb).max(axis=1, keepdims=True)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(emb / scale), -127, 127).astype(np.int8)
        out["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)), dim)
        out["scale"] = pa.array(scale[:, 0])
    elif output_dtype == "binary":
        if dim % 8:
            raise OutputError(f"binary output packs 8 dimensions to a byte; this model has {dim}")
        packed = np.packbits(emb > 0, axis=1)
        out["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(packed.reshape(-1)), dim // 8)
    else:
        raise OutputError(f"output dtype must be one of {', '.join(OUTPUT_DTYPES)}, got {output_dtype!r}")
    return out


def write_shard(directory: str, k: int, cols: Dict[str, object]) -> str:
    """Shard k, written whole under a temporary name and renamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(directory, shard_name(k))
    tmp = path + ".tmp"
    pq.write_table(pa.table(cols), tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def read_manifest(directory: str) -> Optional[dict]:
    path = os.path.join(directory, MANIFEST)
    try:
        manifest = read_json(path)
    except (OSError, ValueError) as e:
        raise OutputError(f"{path} is not readable JSON ({e}); remove the directory to start over") from None
    if manifest is not None and manifest.get("format") != FORMAT:
        raise OutputError(f"{path} is not a fastbert embed manifest")
    return manifest


def write_manifest(directory: str, manifest: dict) -> None:
    write_json(os.path.join(directory, MANIFEST), manifest, indent=1)


def _same_settings(directory: str, manifest: dict, settings: dict) -> None:
    """OutputError when the run in `directory` was written with other settings."""
    if manifest["settings"] != settings:
        changed = sorted(k for k in set(settings) | set(manifest["settings"])
                         if settings.get(k) != manifest["settings"].get(k))
        raise OutputError(f"{directory} holds a run with other settings ({', '.join(changed)}); use another "
                          "--output, or --overwrite to start over")


def finished(directory: str, settings: dict, *, overwrite: bool = False) -> Optional[dict]:
    """The manifest of the finished run `directory` holds when it was written with these settings;
    None when it holds no finished run (or overwrite, which starts over); OutputError when it holds
    a run with other settings. Reads only: a finished command run again changes nothing."""
    manifest = None if overwrite else read_manifest(directory)
    if manifest is None:
        return None
    _same_settings(directory, manifest, settings)
    return manifest if manifest.get("complete") else None


def start(directory: str, settings: dict, *, overwrite: bool = False) -> dict:
    """The manifest to continue: a new one, or the one in `directory` when it was written with the
    same settings (its unlisted files removed); a finished run's as it is, nothing written or
    removed (manifest["complete"]: nothing is left to do); OutputError when the settings differ
    (unless overwrite, which starts over)."""
    manifest = None if overwrite else read_manifest(directory)
    if manifest is not None:
        _same_settings(directory, manifest, settings)
        if manifest.get("complete"):
            return manifest
    else:
        manifest = {"format": FORMAT, "version": 1, "settings": settings, "shards": [], "rows": 0, "complete": False}
    os.makedirs(directory, exist_ok=True)
    listed = {s["file"] for s in manifest["shards"]} | {MANIFEST}
    for name in os.listdir(directory):
        if (name.startswith("part-") or name.endswith(".tmp")) and name not in listed:
            os.remove(os.path.join(directory, name))  # a shard the last run did not finish
    write_manifest(directory, manifest)
    return manifest


def add_shard(directory: str, manifest: dict, cols: Dict[str, object], *, first_position: int, next_position: int,
              skipped: int) -> None:
    k = len(manifest["shards"])
    n = len(cols["id"])
    write_shard(directory, k, cols)
    manifest["shards"].append({"file": shard_name(k), "rows": n, "first_position": first_position,
                               "next_position": next_position, "skipped": skipped})
    manifest["rows"] += n
    write_manifest(directory, manifest)


def next_position(manifest: dict) -> int:
    return manifest["shards"][-1]["next_position"] if manifest["shards"] else 0


def read_embeddings(directory: str):
    """(ids, float32 embeddings [rows, dim] or the stored int8 / packed bytes) of a finished run, in
    order (for checks and tests)."""
    import pyarrow.parquet as pq

    manifest = read_manifest(directory)
    if manifest is None:
        raise OutputError(f"{directory} has no {MANIFEST}")
    ids, parts = [], []
    for shard in manifest["shards"]:
        table = pq.read_table(os.path.join(directory, shard["file"]))
        ids += table.column("id").to_pylist()
        parts.append(_list_rows(table.column("embedding").combine_chunks()))
    return ids, (np.concatenate(parts) if parts else np.zeros((0, 0), np.float32))
