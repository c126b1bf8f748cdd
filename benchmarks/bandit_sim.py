"""Reproduce the bandit-selector results in docs/bandits.md (docs/benchmarks/bandit-sim.json).

    python benchmarks/bandit_sim.py [--horizon 10000] [--seeds 30] [--out DIR]

The scenarios and the verdict live in :mod:`flashspec_bench.scenarios`.
"""

from flashspec_bench.scenarios import main

if __name__ == "__main__":
    raise SystemExit(main())
