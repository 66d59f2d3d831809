"""`fastbert serve`: an embedding, reranking and classification server, compatible with
text-embeddings-inference's routes and OpenAI's /v1/embeddings, with dynamic batching.

    fastbert serve MODEL_DIR [--host 127.0.0.1] [--port 8080] [--quantize int8] [--dtype float32]
                   [--max-batch-tokens 16384] [--max-concurrent-requests 512] [--max-client-batch-size 32]
                   [--api-key KEY] [--task TASK]

What MODEL_DIR holds decides what is served (fastbert.serve.engine): a sentence-transformers
directory -> /embed and /v1/embeddings; a cross-encoder (a sequence classifier with one label) ->
/rerank and /predict; another sequence classifier -> /predict. The routes: fastbert.serve.app; the
batching: fastbert.serve.batching; the metrics: fastbert.serve.metrics. Needs the `serve` extra:
pip install "fastbert[serve]" (uvicorn, starlette, prometheus_client, orjson).

Before the port opens, the model runs a batch in every power-of-two token bucket up to
--max-batch-tokens (at a ragged count such as clients' batches have: Served.warm_up), so the
first-call costs (the GEMM path timed at the first product of each token bucket) are paid before
any client's request. The thread that loaded and warmed the model (the main one) runs every batch;
the HTTP server's event loop runs in a thread of its own (why: the docstring of fastbert.serve.batching).
SIGTERM (or Ctrl-C) stops taking connections, finishes the requests in flight and exits 0.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from fastbert.commands import CommandParser, model_directory

PROG = "fastbert serve"


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog=PROG, description="Serve embeddings, reranking or classification over HTTP "
                      "(text-embeddings-inference's routes and OpenAI's /v1/embeddings).")
    p.add_argument("model", help="a sentence-transformers directory, or a sequence classifier / cross-encoder directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port (default %(default)s)")
    p.add_argument("--quantize", choices=["int8"], default=None, help="int8 weights and activations in the linear layers")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="the model's dtype")
    p.add_argument("--task", default=None, help="a model with task adapters (jina-embeddings-v3): fold this task "
                   "into the weights at load (otherwise each request's prompt_name that names a task runs it)")
    p.add_argument("--backend", choices=["cpp", "torch", "triton"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--max-batch-tokens", type=int, default=16384,
                   help="real tokens in one batch of the model (default %(default)s)")
    p.add_argument("--max-concurrent-requests", type=int, default=512,
                   help="requests queued or running; one more is answered 429 (default %(default)s)")
    p.add_argument("--max-client-batch-size", type=int, default=32,
                   help="inputs in one request; more is answered 413 (default %(default)s)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` (all routes but /health)")
    p.add_argument("--model-id", default=None, help="the name /info and /v1/embeddings report (default: MODEL_DIR)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def _check(args, p: argparse.ArgumentParser) -> None:
    for name in ("max_batch_tokens", "max_concurrent_requests", "max_client_batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.port < 65536:
        p.error(f"--port must be in 0..65535, got {args.port}")


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    _check(args, p)
    model_directory(args.model)  # named before the serve extra is needed
    try:
        import uvicorn
    except ImportError:
        raise RuntimeError('serving needs the serve extra: pip install "fastbert[serve]" (uvicorn, starlette, '
                           "prometheus_client, orjson)") from None
    from fastbert.dtypes import parse_dtype
    from fastbert.serve.app import App, create_app
    from fastbert.serve.engine import Served

    t0 = time.perf_counter()
    served = Served(args.model, quantize=args.quantize, dtype=parse_dtype(args.dtype) if args.dtype else None,
                    backend=args.backend, task=args.task)
    loaded = time.perf_counter() - t0
    batches = served.warm_up(args.max_batch_tokens)
    print(f"{PROG}: {served.kind} model {args.model} ({served.dtype}{', int8' if served.quantize else ''}) loaded in "
          f"{loaded:.1f} s, warmed up in {time.perf_counter() - t0 - loaded:.1f} s ({batches} batches up to "
          f"{args.max_batch_tokens} tokens)", file=sys.stderr, flush=True)
    app = App(served, max_batch_tokens=args.max_batch_tokens, max_concurrent_requests=args.max_concurrent_requests,
              max_client_batch_size=args.max_client_batch_size, api_key=args.api_key, model_id=args.model_id,
              model_thread=False)
    config = uvicorn.Config(create_app(app), host=args.host, port=args.port, log_level=args.log_level,
                            access_log=False, timeout_graceful_shutdown=60)
    server = uvicorn.Server(config)
    failed = []

    def http() -> None:
        try:
            server.run()
        except BaseException as e:  # noqa: BLE001 - uvicorn exits with SystemExit(1) when it cannot listen
            failed.append(e)
        finally:
            app.batcher.stop()  # the model loop below returns once uvicorn is done, however it ended

    # uvicorn installs signal handlers only in the main thread: these stop it as its own would (no new
    # connections, the requests in flight answered; a second Ctrl-C forces)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)
    thread = threading.Thread(target=http, name="fastbert-http")
    thread.start()
    try:
        app.batcher.work()
    finally:
        server.should_exit = True  # the model loop ended (or failed): the HTTP server stops too
        thread.join()
    if not server.started:
        raise RuntimeError(f"the HTTP server did not start on {args.host}:{args.port} (uvicorn's ERROR line above says why)")
    if failed:  # uvicorn failed after it had started: its own error, not a port that never opened
        raise failed[0]
    print(f"{PROG}: stopped", file=sys.stderr, flush=True)
    return 0
