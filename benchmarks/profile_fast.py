"""Where a forward of the fast back-end spends its GPU time; writes fast-profile-h200.json.

    python benchmarks/profile_fast.py --out DIR [--budget 240] [--commit SHA]

See :mod:`flashspec_bench.profiling`.
"""

from flashspec_bench.profiling import main

if __name__ == "__main__":
    raise SystemExit(main())
