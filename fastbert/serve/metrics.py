"""The server's Prometheus metrics (GET /metrics), named after text-embeddings-inference's with a
fastbert_ prefix: requests by route and status, their duration, time in the queue, each batch's
size, real tokens and inference time, and the requests queued or running."""
from __future__ import annotations


class Metrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        seconds = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
        self.requests = Counter("fastbert_request", "Requests answered, by route and HTTP status",
                                ["route", "status"], registry=r)
        self.request_duration = Histogram("fastbert_request_duration_seconds", "Time from request to answer",
                                          ["route"], buckets=seconds, registry=r)
        self.queue_duration = Histogram("fastbert_queue_duration_seconds", "Time a request waited for the model",
                                        buckets=seconds, registry=r)
        self.inference_duration = Histogram("fastbert_inference_duration_seconds", "Time the model ran one batch",
                                            buckets=seconds, registry=r)
        self.batch_size = Histogram("fastbert_batch_size", "Sequences in a batch",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.batch_tokens = Histogram("fastbert_batch_tokens", "Real tokens in a batch",
                                      buckets=(16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768), registry=r)
        self.queue_size = Gauge("fastbert_queue_size", "Requests queued or running", registry=r)
        self.tokens = Counter("fastbert_input_tokens", "Real tokens of the inputs that reached the model", registry=r)

    def batch(self, sequences: int, tokens: int, seconds: float) -> None:
        self.batch_size.observe(sequences)
        self.batch_tokens.observe(tokens)
        self.tokens.inc(tokens)
        self.inference_duration.observe(seconds)

    def answered(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_duration.labels(route).observe(seconds)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
