"""`fastbert embed`: a corpus into Parquet embedding shards (embed.py), streaming readers of text,
JSON Lines and Parquet (readers.py), the shards and the manifest that make a run resumable
(shards.py). Needs pyarrow (the `embed` extra)."""
