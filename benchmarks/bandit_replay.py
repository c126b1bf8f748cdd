"""Replay recorded H200 decode steps through the selectors (docs/benchmarks/bandit-replay.json).

    python benchmarks/bandit_replay.py [--seeds 20] [--batches 1,2,4,8,16,32]
    python benchmarks/bandit_replay.py --extract sweep_b1/bench.json sweep_b8/bench.json ...

The replay and its systems live in :mod:`flashspec_bench.replay`.
"""

from flashspec_bench.replay import main

if __name__ == "__main__":
    raise SystemExit(main())
