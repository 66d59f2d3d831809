"""Benchmark the whole encoder against transformers and the GEMM floor: see fastbert/bench/encoder.py
(the same code runs as `fastbert bench`, at a size that finishes in under a minute).

    python benchmarks/bench_encoder.py [--workloads var128,full128,var512,minilm] [--dtypes float32,bfloat16]
        [--layers 12] [--rounds 3] [--json PATH] [--png PATH]
"""
import sys

from fastbert.bench.encoder import main

if __name__ == "__main__":
    sys.exit(main())
