"""kbroker benchmark suite: the same workloads against kbroker and a reference peer (librdkafka's mock cluster).

Run `python -m bench --help`. Workloads live in one module each (produce, consume, latency, sizes, scale,
restart); bench.harness starts and stops the brokers and measures them, bench.report writes RESULTS.md.
"""
