"""What `fastbert bench` and benchmarks/ run: workloads, providers, timing, tables and plots."""
