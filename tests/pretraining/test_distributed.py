"""Two processes under torchrun (gloo on the CPU): data parallel training through the CLI, and
resumption of a two-process run."""
import json
import os
import subprocess
import sys

import torch

import fastbert
from fastbert.pretraining import checkpoint as ckpt

TINY = ["--hidden-size", "32", "--num-layers", "2", "--num-heads", "2", "--intermediate-size", "64",
        "--max-position-embeddings", "64", "--batch-size", "4", "--eval-batch-size", "16", "--eval-max-batches", "2",
        "--log-every", "1", "--no-progress", "--no-plot", "--save-every", "0"]


def torchrun(args, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "fastbert.cli", "pretrain", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_two_process_gloo_run_and_resume(tiny_data, tmp_path):
    out = str(tmp_path / "ddp")
    first = torchrun(["--data", tiny_data, "--out", out, "--max-steps", "4", "--stop-after", "2", *TINY])
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 process(es) x batch 4" in first.stdout
    state = ckpt.load_checkpoint(ckpt.find_latest(os.path.join(out, "checkpoints")))
    assert state["step"] == 2 and len(state["rng"]) == 2 and state["run"]["world_size"] == 2
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])  # dropout streams differ

    second = torchrun(["--data", tiny_data, "--out", out, "--max-steps", "4", "--resume", *TINY])
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed from" in second.stdout and "replicas differ" not in second.stdout + second.stderr
    assert "held-out" in second.stdout and "NSP accuracy" in second.stdout
    steps = [r["step"] for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if r["type"] == "train"]
    assert steps == [1, 2, 3, 4]
    model = fastbert.BertForPreTraining.from_pretrained(out)
    assert all(torch.isfinite(p).all() for p in model.parameters())
