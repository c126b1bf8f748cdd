"""Derived figures behind docs/kernels.md's H200 sections, from verify-kernels-h200.json.

    python benchmarks/verify_kernels_analysis.py [--json PATH] [--out PATH]

Writes docs/benchmarks/verify-kernels-h200-analysis.json; see :mod:`flashspec_bench.verify_analysis`.
"""

from flashspec_bench.verify_analysis import main

if __name__ == "__main__":
    raise SystemExit(main())
