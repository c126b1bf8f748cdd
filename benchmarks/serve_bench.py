"""Throughput and latency of ``flashspec serve`` under 1 .. 64 concurrent clients, beside offline generate and the peer.

    python benchmarks/serve_bench.py --config my.toml [--concurrency 1,8,32,64] [--no-spec] [--peer DIR] [--commit SHA]
    python benchmarks/serve_bench.py --smoke   # the tiny random models on the CPU
    python benchmarks/serve_bench.py --config my.toml --distinct   # no request repeats an earlier one's prompt

Writes docs/benchmarks/serve-h200.json (with --smoke: benchmarks/.results/serve-smoke.json);
see :mod:`flashspec_bench.serve`.
"""

from flashspec_bench.serve import main

if __name__ == "__main__":
    raise SystemExit(main())
