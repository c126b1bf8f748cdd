"""Derived figures behind docs/performance.md and docs/bandits.md, from the raw H200 rows.

    python benchmarks/e2e_analysis.py [--raw PATH] [--out PATH]

Reads the raw rows ``benchmarks/e2e_h200.py summarize`` left in the git-ignored
``benchmarks/.results/`` and writes docs/benchmarks/e2e-h200-analysis.json; see
:mod:`flashspec_bench.analysis`.
"""

from flashspec_bench.analysis import main

if __name__ == "__main__":
    raise SystemExit(main())
