"""The training loop: exact resumption, checkpoints written on a signal, damaged checkpoints named,
the output directory loading in fastbert and transformers, bad settings."""
import json
import os
import subprocess
import sys

import pytest
import torch

import fastbert
from fastbert.pretraining import checkpoint as ckpt
from fastbert.pretraining.config import TrainError
from fastbert.pretraining.trainer import train
from tests.helpers.pretraining import TINY_ARGS, tiny_config


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tiny_data, tmp_path):
    full = train(tiny_config(tiny_data, str(tmp_path / "full"), max_steps=6, grad_accum=2))
    assert len(full.losses) == 6 and not full.interrupted

    out = str(tmp_path / "split")
    first = train(tiny_config(tiny_data, out, max_steps=6, grad_accum=2, stop_after=3))
    assert first.interrupted and first.step == 3 and first.checkpoint.endswith("step-00000003.pt")
    second = train(tiny_config(tiny_data, out, max_steps=6, grad_accum=2, resume="auto"))
    assert second.step == 6
    assert first.losses + second.losses == full.losses  # bit for bit
    a = fastbert.BertForPreTraining.from_pretrained(str(tmp_path / "full"))
    b = fastbert.BertForPreTraining.from_pretrained(out)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    assert first.first_eval == full.first_eval and second.last_eval == full.last_eval
    # the log holds each step once
    steps = [r["step"] for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if r["type"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]


# A signal is tested in a process of its own, as a run receives it. Sent to the test process itself,
# after the tests before it had run there, it killed the suite: in its core, the memory of the main
# thread's alternate signal stack (faulthandler's, which the handlers Python installs run on) had been
# freed, and the kernel could not deliver the signal (SIGSEGV, SI_KERNEL, inside os.kill).
SIGNAL_RUN = """
import os, signal, sys
from fastbert.pretraining import checkpoint as ckpt
from fastbert.pretraining.config import TrainError
from fastbert.pretraining.trainer import Trainer, train
from tests.helpers.pretraining import tiny_config

data, out, name = sys.argv[1:4]
sig = getattr(signal, name)
before = signal.getsignal(sig)

def on_step(trainer, step, loss):
    if step == 2:
        os.kill(os.getpid(), sig)

result = Trainer(tiny_config(data, out, max_steps=50 if name == "SIGTERM" else 4), on_step=on_step).train()
assert result.interrupted and result.signal == sig and result.step == 2, result
assert ckpt.find_latest(os.path.join(out, "checkpoints")) == result.checkpoint
state = ckpt.load_checkpoint(result.checkpoint)
assert state["step"] == 2 and state["consumed"] == 2
assert signal.getsignal(sig) is before  # the handler is restored
if name == "SIGTERM":
    try:  # a changed schedule is refused
        train(tiny_config(data, out, max_steps=4, resume="auto"))
        raise AssertionError("a changed max_steps was not refused")
    except TrainError as e:
        assert "max_steps" in str(e), e
else:
    second = train(tiny_config(data, out, max_steps=4, resume="auto"))
    assert second.step == 4 and len(second.losses) == 2
print("ok")
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_writes_a_checkpoint_and_stops(tiny_data, tmp_path, name):
    """SIGTERM or SIGINT at step 2: a checkpoint at step 2, the loop stopped, the previous handler
    back; SIGTERM's run resumed with another schedule is refused, SIGINT's resumes to its end."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", SIGNAL_RUN, tiny_data, str(tmp_path / "run"), name], cwd=root,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


@pytest.mark.parametrize("damage", ["truncated", "flipped", "missing", "garbage_manifest", "not_a_checkpoint"])
def test_a_damaged_checkpoint_is_named_and_never_skipped(tiny_data, tmp_path, damage):
    out = str(tmp_path / "run")
    result = train(tiny_config(tiny_data, out, max_steps=2))
    path = result.checkpoint
    manifest = os.path.join(out, "checkpoints", "checkpoints.json")
    if damage == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 3])
        expect = "partial or damaged"
    elif damage == "flipped":
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(path, "wb").write(bytes(data))
        expect = "SHA-256"
    elif damage == "missing":
        os.remove(path)
        expect = "missing"
    elif damage == "garbage_manifest":
        open(manifest, "w").write("{not json")
        expect = "manifest .* is damaged"
    else:
        os.remove(manifest)
        torch.save({"something": 1}, path)
        with pytest.raises(TrainError, match="not a fastbert pretraining checkpoint"):
            train(tiny_config(tiny_data, out, max_steps=4, resume=path))
        return
    with pytest.raises(TrainError, match=expect) as info:
        train(tiny_config(tiny_data, out, max_steps=4, resume="auto"))
    assert "cannot resume" in str(info.value)


def test_resume_with_nothing_to_resume_is_an_error(tiny_data, tmp_path):
    with pytest.raises(TrainError, match="no checkpoint"):
        train(tiny_config(tiny_data, str(tmp_path / "empty"), resume="auto"))


def test_changed_settings_are_refused_on_resume_and_old_runs_kept(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    assert train(tiny_config(tiny_data, out, max_steps=2, stop_after=1)).interrupted
    with pytest.raises(TrainError, match="lr: checkpoint 0.001, now 0.002"):
        train(tiny_config(tiny_data, out, max_steps=2, lr=2e-3, resume="auto"))
    with pytest.raises(TrainError, match="--resume .* --overwrite"):
        train(tiny_config(tiny_data, out, max_steps=2))
    assert train(tiny_config(tiny_data, out, max_steps=1, overwrite=True)).step == 1


def _files(directory):
    """{path: (bytes, mtime in ns)} of every file under `directory`."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def test_a_finished_run_run_again_succeeds_and_changes_nothing(tiny_data, tmp_path):
    """A scheduler's retry after a kill that landed after the last checkpoint, or a pipeline run
    again, with or without --resume: nothing trained, not a byte nor an mtime changed; other
    settings are refused and --overwrite starts over."""
    out = str(tmp_path / "run")
    first = train(tiny_config(tiny_data, out, max_steps=2, plot=True))
    before = _files(out)
    assert "checkpoints/step-00000002.pt" in before and "model.safetensors" in before and "log.jsonl" in before
    for resume in (None, "auto"):
        printed = []
        again = train(tiny_config(tiny_data, out, max_steps=2, plot=True, resume=resume), print_fn=printed.append)
        assert printed == [f"{out} already holds the finished run (step 2 of 2); nothing to do (--overwrite starts over)"]
        assert again.step == 2 and again.losses == [] and again.checkpoint == first.checkpoint
        assert again.first_eval == first.first_eval and again.last_eval == first.last_eval
        assert _files(out) == before
    with pytest.raises(TrainError, match=r"holds the finished run of other settings \(lr: checkpoint 0.001, now 0.002\); "
                                         "use another --out, or --overwrite to start over"):
        train(tiny_config(tiny_data, out, max_steps=2, lr=2e-3))
    assert _files(out) == before
    assert train(tiny_config(tiny_data, out, max_steps=2, overwrite=True)).losses == first.losses  # starts over


def test_max_seq_length_beyond_max_position_embeddings_is_an_error(tiny_data, tmp_path):
    with pytest.raises(TrainError, match="max_seq_length 32 is larger than the 16 positions the model has an embedding for"):
        train(tiny_config(tiny_data, str(tmp_path / "o"), max_position_embeddings=16))


def test_output_directory_loads_in_fastbert_and_transformers(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    result = train(tiny_config(tiny_data, out, max_steps=3, eval_every=2, plot=True, whole_word_mask=True))
    assert result.first_eval is not None and result.last_eval is not None
    recs = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    assert [r["step"] for r in recs if r["type"] == "eval"] == [0, 2, 3]
    train_rec = [r for r in recs if r["type"] == "train"][0]
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "tokens_per_s"):
        assert key in train_rec
    try:
        import matplotlib  # noqa: F401

        assert os.path.isfile(os.path.join(out, "curves.png"))
    except ImportError:
        pass
    ours = fastbert.BertForPreTraining.from_pretrained(out)
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["the value of an object", "a list"], ["is kept", "of items"], return_tensors="pt", padding=True)
    with torch.no_grad():
        a = ours(**enc)
        b = hf(**enc)
    real = enc["attention_mask"].bool()
    assert torch.allclose(a.prediction_logits[real], b.prediction_logits[real], atol=1e-4, rtol=1e-4)
    assert torch.allclose(a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-4, rtol=1e-4)


def test_bf16_autocast_and_accumulation_run(tiny_data, tmp_path):
    result = train(tiny_config(tiny_data, str(tmp_path / "bf16"), max_steps=2, precision="bf16", grad_accum=2))
    assert all(torch.isfinite(torch.tensor(result.losses)))


def test_pretrain_cli_prepares_a_corpus_reuses_it_and_reports(tmp_path, capsys):
    from fastbert import cli
    from fastbert.data.corpus import write_documents
    from tests.helpers.pretraining import small_documents

    corpus = str(tmp_path / "corpus.txt")
    write_documents(small_documents(30)(), corpus)
    out = str(tmp_path / "run")
    assert cli.main(["pretrain", "--corpus", corpus, "--out", out, "--max-steps", "2", *TINY_ARGS]) == 0
    printed = capsys.readouterr().out
    assert "preparing" in printed and "pairs (train)" in printed
    for line in ("MLM loss", "MLM accuracy", "NSP accuracy", "start (step 0)", "end (step 2)", f"output: {out}"):
        assert line in printed, line
    assert os.path.isfile(os.path.join(out, "data", "index.json"))
    # a second run with the same data settings reuses the prepared data; a damaged checkpoint stops it
    ckpt_file = ckpt.find_latest(os.path.join(out, "checkpoints"))
    with open(ckpt_file, "r+b") as f:
        f.truncate(100)
    assert cli.main(["pretrain", "--corpus", corpus, "--out", out, "--max-steps", "2", "--resume", *TINY_ARGS]) == 2
    captured = capsys.readouterr()
    assert "reusing" in captured.out
    assert captured.err.startswith("fastbert pretrain: error: cannot resume") and os.path.basename(ckpt_file) in captured.err


def test_pretrain_cli_run_again_on_a_finished_run_exits_0_and_changes_nothing(tiny_data, tmp_path, capsys):
    from fastbert import cli

    out = str(tmp_path / "run")
    args = ["pretrain", "--data", tiny_data, "--out", out, "--max-steps", "2", "--save-every", "0", *TINY_ARGS]
    assert cli.main(args) == 0
    before = _files(out)
    capsys.readouterr()
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert f"{out} already holds the finished run (step 2 of 2); nothing to do (--overwrite starts over)" in printed
    assert _files(out) == before
    assert cli.main([*args, "--seed", "1"]) == 2  # other settings: one line, nothing touched
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "holds the finished run of other settings (seed: checkpoint 0, now 1)" in err[0]
    assert _files(out) == before


def test_pretrain_cli_refuses_other_data_settings_before_preparing_over_a_run(tmp_path, capsys):
    from fastbert import cli
    from fastbert.data.corpus import write_documents
    from tests.helpers.pretraining import small_documents

    corpus = str(tmp_path / "corpus.txt")
    write_documents(small_documents(30)(), corpus)
    out = str(tmp_path / "run")
    args = ["pretrain", "--corpus", corpus, "--out", out, "--max-steps", "1", "--save-every", "0", *TINY_ARGS]
    assert cli.main(args) == 0
    before = _files(out)
    capsys.readouterr()
    assert cli.main([*args, "--dupe-factor", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "was prepared with other data settings than these; use another --out, or --overwrite" in err[0]
    assert _files(out) == before


def test_pretrain_cli_bad_input(tmp_path, capsys):
    from fastbert import cli

    assert cli.main(["pretrain", "--corpus", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o"), *TINY_ARGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastbert pretrain: error: ") and "missing.txt does not exist" in err and len(err.splitlines()) == 1
    assert cli.main(["pretrain", "--data", str(tmp_path / "nodata"), "--out", str(tmp_path / "o"), *TINY_ARGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastbert pretrain: error: ") and "nodata" in err and "does not exist" in err, err


def test_time_limit_stops_early_with_a_final_evaluation_and_a_checkpoint(tiny_data, tmp_path):
    import time

    out = str(tmp_path / "run")
    result = train(tiny_config(tiny_data, out, max_steps=50, time_limit=16.0, started=time.time() - 10.0))
    assert result.time_limited and not result.interrupted and result.step == 1  # 10 + 15 s of margin > 16 s
    assert result.last_eval is not None and result.checkpoint is not None
    resumed = train(tiny_config(tiny_data, out, max_steps=50, resume="auto"))
    assert resumed.step == 50
