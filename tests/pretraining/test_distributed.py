"""Two processes under torchrun (gloo on the CPU): data parallel training through the CLI, and
resumption of a two-process run."""
import json
import os
import subprocess
import sys

import pytest
import torch

import fastbert
from fastbert.pretraining import checkpoint as ckpt

pytestmark = pytest.mark.slow

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


def final_eval(out):
    evals = [r for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if r["type"] == "eval"]
    return evals[0], evals[-1]


def test_one_and_two_processes_converge_alike(tiny_data, tmp_path):
    """The same global batch (8 pairs) and settings at 1 process and at 2 (4 pairs each): the
    held-out MLM loss falls by about as much (the runs differ in dropout and mask streams, so
    not to the bit)."""
    common = ["--data", tiny_data, "--max-steps", "60", "--lr", "2e-3", "--eval-every", "0", *TINY]
    common[common.index("--batch-size") + 1] = "8"
    one_out, two_out = str(tmp_path / "one"), str(tmp_path / "two")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, "-m", "fastbert.cli", "pretrain", "--out", one_out, *common], env=env,
                         capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stdout + one.stderr
    two_args = list(common)
    two_args[two_args.index("--batch-size") + 1] = "4"
    two = torchrun(["--out", two_out, *two_args])
    assert two.returncode == 0, two.stdout + two.stderr
    (start1, end1), (start2, end2) = final_eval(one_out), final_eval(two_out)
    assert abs(start1["mlm_loss"] - start2["mlm_loss"]) < 1e-3  # the same initial weights and held-out masks
    fall1, fall2 = start1["mlm_loss"] - end1["mlm_loss"], start2["mlm_loss"] - end2["mlm_loss"]
    # measured: 5.994 -> 5.409 (1 process) and -> 5.414 (2 processes)
    assert fall1 > 0.3 and fall2 > 0.3, (fall1, fall2)
    assert abs(fall1 - fall2) < 0.2 * max(fall1, fall2), (start1, end1, start2, end2)
