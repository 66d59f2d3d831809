"""The embed job behind `fastbert embed` (fastbert.commands.embed): the job, what is computed and
written, with the prologue and epilogue its runners share (job.py); its local runner (local.py; the
Ray runner is fastbert.ray); streaming readers of text, JSON Lines and Parquet (readers.py); the
shards and the manifest that make a run resumable (shards.py). Needs pyarrow (the `embed` extra)."""
