"""`fastbert pretrain`: train BertForPreTraining (MLM + NSP), or XLMRobertaForMaskedLM (MLM, a
sentencepiece Unigram vocabulary) with --model-type xlm-roberta, on fastbert's fused ops.

    fastbert pretrain                                   # the built-in demo: pydoc_data.topics, a 4-layer BERT
    fastbert pretrain --corpus books/ --out run1        # prepare a corpus, then train on it
    fastbert pretrain --corpus ko/ --model-type xlm-roberta --out run2   # an XLM-R-shaped model
    fastbert pretrain --data prepared/ --out run1       # train on data `fastbert prepare` made
    fastbert pretrain --out run1 --resume               # continue run1 from its latest checkpoint
    torchrun --nproc_per_node 2 -m fastbert.cli pretrain ...   # data parallel, one process per device / core group

With no --corpus and no --data the built-in corpus is used: the documentation text of the standard
library (pydoc_data.topics), present wherever Python is. Its vocabulary and pairs are prepared into
<out>/data (kept and reused by later runs with the same settings).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from fastbert.commands import CommandParser, report
from fastbert.data.prepare import PrepareError, add_data_arguments, format_summary, prepare_from_args
from fastbert.pretraining.checkpoint import CheckpointError
from fastbert.pretraining.config import PRECISIONS, TrainConfig, TrainError
from fastbert.pretraining.distributed import barrier, init_distributed
from fastbert.pretraining.logs import format_eval_table
from fastbert.pretraining.trainer import train

DEFAULT_OUT = "fastbert-pretrain-out"
# Settings that differ between the built-in run (a demo that must finish in minutes on two CPU cores,
# on a 50k-token corpus: its time on the 2-core machines is in benchmarks/RESULTS.md, "Pretraining";
# the time limit, counted from the start of the command, stops it with a final evaluation and
# checkpoint on a slower one) and a run on a corpus of one's own; an option given on the command line wins.
BUILTIN = dict(vocab_size=8000, max_seq_length=64, dupe_factor=10, eval_fraction=0.1, batch_size=64, max_steps=600,
               eval_every=100, time_limit=6.0)
GENERAL = dict(vocab_size=30522, max_seq_length=128, dupe_factor=5, eval_fraction=0.05, batch_size=32, max_steps=None,
               eval_every=1000, time_limit=0.0)
BUILTIN_TIME_LIMIT_MIN = BUILTIN["time_limit"]


def _both(key: str, fmt=str) -> str:
    general = GENERAL[key]
    return f"built-in run: {fmt(BUILTIN[key])}; with --corpus / --data: {fmt(general) if general is not None else 'none'}"


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="fastbert pretrain",
        description="Pretrain BERT (MLM + NSP), or XLM-RoBERTa (MLM) with --model-type xlm-roberta, on fastbert's "
                    "fused ops. With no --corpus / --data: the built-in corpus (the standard library's "
                    "pydoc_data.topics) and a 4-layer model, a few minutes on a CPU.",
    )
    src = p.add_argument_group("input and output")
    src.add_argument("--corpus", nargs="+", help="text files / directories to prepare and train on")
    src.add_argument("--data", help="a directory prepared by `fastbert prepare`")
    src.add_argument("--out", default=DEFAULT_OUT, help="output directory (default ./%(default)s)")
    src.add_argument("--resume", nargs="?", const="auto", default=None, metavar="PATH",
                     help="continue from the latest checkpoint in --out, or from PATH (a checkpoint file or directory)")
    src.add_argument("--overwrite", action="store_true", help="start over in an --out that holds checkpoints")
    add_data_arguments(p, defaults={k: None for k in ("vocab_size", "max_seq_length", "dupe_factor", "eval_fraction")},
                       default_text={k: _both(k) for k in ("vocab_size", "max_seq_length", "dupe_factor", "eval_fraction")})

    m = p.add_argument_group("model")
    m.add_argument("--hidden-size", type=int, default=256)
    m.add_argument("--num-layers", type=int, default=4)
    m.add_argument("--num-heads", type=int, default=4)
    m.add_argument("--intermediate-size", type=int, default=1024)
    m.add_argument("--max-position-embeddings", type=int, default=512)
    m.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout (default %(default)s)")
    m.add_argument("--config", dest="model_config", help="a BERT config.json giving the model's shape instead")
    m.add_argument("--init-from", help="start from this pretrained model directory (its vocabulary must be the data's)")
    m.add_argument("--backend", choices=("cpp", "torch", "triton"), default=None,
                   help="fastbert ops backend (default: cpp on CPU, triton on CUDA)")
    m.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")

    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, default=None, help=f"pairs per process and micro-batch ({_both('batch_size')})")
    t.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (default %(default)s)")
    t.add_argument("--max-steps", type=int, default=None,
                   help=f"optimizer steps (built-in run: {BUILTIN['max_steps']}; with --corpus / --data: 1 epoch)")
    t.add_argument("--epochs", type=float, default=None, help="passes over the training pairs, instead of --max-steps")
    t.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (default %(default)s)")
    t.add_argument("--warmup", type=float, default=0.1,
                   help="warm-up: a fraction of the steps (< 1) or a number of steps (default %(default)s)")
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    t.add_argument("--mlm-probability", type=float, default=0.15)
    t.add_argument("--whole-word-mask", action="store_true", help="mask whole words (WordPiece '##' pieces together)")
    t.add_argument("--max-predictions", type=int, default=None, help="at most this many masked tokens per pair")
    t.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype (default %(default)s)")
    t.add_argument("--seed", type=int, default=0)

    e = p.add_argument_group("evaluation, logging, checkpoints")
    e.add_argument("--eval-every", type=int, default=None,
                   help=f"held-out evaluation every N steps, 0: start and end only ({_both('eval_every')})")
    e.add_argument("--eval-batch-size", type=int, default=64)
    e.add_argument("--eval-max-batches", type=int, default=None)
    e.add_argument("--log-every", type=int, default=10)
    e.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (0: only at the end)")
    e.add_argument("--keep-checkpoints", type=int, default=2)
    e.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    e.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    e.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="stop early, with a final evaluation and a checkpoint, rather than run past this many minutes "
                        f"from the start, 0: none (built-in run: {BUILTIN_TIME_LIMIT_MIN}; with --corpus / --data: none)")
    e.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)
    return p


def _data_request(args) -> dict:
    keys = ("model_type", "corpus_format", "vocab", "vocab_size", "cased", "min_frequency", "max_seq_length", "dupe_factor",
            "short_seq_prob", "eval_fraction", "shard_size", "data_seed")
    req = {k: getattr(args, k) for k in keys}
    if args.corpus:
        files = []
        from fastbert.data.corpus import expand_paths

        for f in expand_paths(args.corpus):
            st = os.stat(f)
            files.append([os.path.abspath(f), st.st_size, int(st.st_mtime)])
        req["corpus"] = files
    else:
        req["corpus"] = "built-in: pydoc_data.topics"
    return req


def _prepared_matches(data_dir: str, request: dict) -> bool:
    try:
        with open(os.path.join(data_dir, "request.json"), encoding="utf-8") as f:
            return json.load(f) == json.loads(json.dumps(request)) and os.path.isfile(os.path.join(data_dir, "index.json"))
    except (OSError, ValueError):
        return False


def _prepare(args, info) -> str:
    """The data directory to train on: --data, or <out>/data prepared (by process 0) when needed."""
    if args.data:
        if args.corpus:
            raise PrepareError("give --corpus or --data, not both")
        return args.data
    data_dir = os.path.join(args.out, "data")
    request = _data_request(args)
    if _prepared_matches(data_dir, request):
        if info.is_main:
            print(f"data: reusing {data_dir} (prepared earlier with the same settings)")
        return data_dir
    if args.resume is not None:
        raise PrepareError(
            f"cannot resume: {data_dir} is missing or was prepared with other data settings than these; resume with "
            "the options of the original run"
        )
    if not args.overwrite and os.path.isfile(os.path.join(args.out, "checkpoints", "checkpoints.json")):
        # refused before the run's data is prepared again over it
        raise PrepareError(f"{args.out} holds checkpoints and {data_dir} is missing or was prepared with other data "
                           "settings than these; use another --out, or --overwrite to start over")
    if info.is_main:
        from fastbert.data import default_corpus

        t0 = time.perf_counter()
        what = ", ".join(args.corpus) if args.corpus else "the built-in corpus (pydoc_data.topics)"
        print(f"preparing {what} -> {data_dir}")
        docs = None if args.corpus else default_corpus.documents
        index = prepare_from_args(args, data_dir, corpus=args.corpus, documents=docs, progress=not args.no_progress)
        with open(os.path.join(data_dir, "request.json"), "w", encoding="utf-8") as f:
            json.dump(request, f)
        print(format_summary(index))
        print(f"data prepared in {time.perf_counter() - t0:.1f} s")
    barrier(info)
    return data_dir


def apply_defaults(args) -> None:
    """Fill the options left unset with the built-in run's settings or the general ones."""
    table = GENERAL if (args.corpus or args.data) else BUILTIN
    for key, value in table.items():
        if key == "max_steps":
            if args.max_steps is None and args.epochs is None:
                if value is None:
                    args.epochs = 1.0
                else:
                    args.max_steps = value
        elif getattr(args, key) is None:
            setattr(args, key, value)


def config_from_args(args, data_dir: str, started: float | None = None) -> TrainConfig:
    max_steps = args.max_steps
    limit = args.time_limit
    return TrainConfig(
        data_dir=data_dir, out_dir=args.out,
        hidden_size=args.hidden_size, num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
        intermediate_size=args.intermediate_size, max_position_embeddings=args.max_position_embeddings,
        dropout=args.dropout, model_config=args.model_config, init_from=args.init_from,
        batch_size=args.batch_size, grad_accum=args.grad_accum, max_steps=max_steps, epochs=args.epochs, lr=args.lr,
        warmup=args.warmup, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
        mlm_probability=args.mlm_probability, whole_word_mask=args.whole_word_mask,
        max_predictions=args.max_predictions, precision=args.precision, seed=args.seed, backend=args.backend,
        device=args.device, eval_every=args.eval_every, eval_batch_size=args.eval_batch_size,
        eval_max_batches=args.eval_max_batches, log_every=args.log_every, save_every=args.save_every,
        keep_checkpoints=args.keep_checkpoints, resume=args.resume, overwrite=args.overwrite,
        progress=not args.no_progress, plot=not args.no_plot, stop_after=args.stop_after,
        time_limit=limit * 60 if limit else None, started=started,
    )


def _passive_openmp(argv) -> None:
    """Re-run this command with OMP_WAIT_POLICY=PASSIVE when it was started from the command line
    without one.

    OpenMP threads that finish a parallel region first spin until their partners finish. When the
    cores are shared with other work, a partner is often descheduled, and the spinning thread burns
    the core that partner needs: on a busy 2-core machine a training step with 2 spinning threads
    ran several times slower than with waiting threads that sleep, which ran as fast as one thread.
    The policy is read once, when torch loads the OpenMP runtime, so it can only be set by starting again."""
    if os.environ.get("OMP_WAIT_POLICY") or not hasattr(sys, "orig_argv"):
        return
    from_command_line = argv is None or (sys.argv[1:2] == ["pretrain"] and list(argv) == sys.argv[2:])
    import torch

    if not from_command_line or torch.get_num_threads() < 2:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))


def _trained_class(out_dir: str) -> str:
    try:
        with open(os.path.join(out_dir, "config.json"), encoding="utf-8") as f:
            return json.load(f)["architectures"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return "AutoModelForPreTraining"


def main(argv=None) -> int:
    _passive_openmp(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_defaults(args)
    if not (args.corpus or args.data) and args.resume is None and not args.overwrite:
        # the built-in demo starts over in its directory (a run on one's own corpus is never overwritten
        # without --overwrite)
        args.overwrite = True
        earlier = os.path.isfile(os.path.join(args.out, "checkpoints", "checkpoints.json"))
        if earlier and os.environ.get("RANK", "0") == "0":
            print(f"note: starting over in {args.out} (--resume would continue the run there instead)")
    t0 = time.perf_counter()
    started = time.time()
    info = init_distributed(args.device)
    try:
        data_dir = _prepare(args, info)
        result = train(config_from_args(args, data_dir, started), info)
    except (PrepareError, TrainError, CheckpointError, ValueError, FileNotFoundError) as e:
        if info.is_main:
            report(parser.prog, e)
        return 2
    finally:
        if info.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    if not info.is_main:
        return 0 if not result.signal else 128 + int(result.signal)
    print()
    print(format_eval_table(result.first_eval, result.last_eval, result.step))
    print()
    print(f"output: {os.path.abspath(args.out)}")
    files = [f for f in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json")
             if os.path.isfile(os.path.join(args.out, f))]
    print(f"  {', '.join(files):<60}the model (fastbert.{_trained_class(args.out)}.from_pretrained / transformers)")
    if os.path.isfile(os.path.join(args.out, "curves.png")):
        print(f"  {'log.jsonl, curves.png, checkpoints/':<60}training log, curves, resumable state")
    else:
        print(f"  {'log.jsonl, checkpoints/':<60}training log, resumable state")
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    if result.signal:
        return 128 + int(result.signal)
    return 0
