"""A real domain-shifting workload for the bandit selectors, replayed from exact traces.

    python benchmarks/bandit_workload.py trace      # CPU, models cached; checkpoints per prompt
    python benchmarks/bandit_workload.py simulate [--costs FILE]   # every policy over the traces

``trace`` writes docs/benchmarks/bandit-workload-traces.json (:mod:`flashspec_bench.traces`);
``simulate`` writes docs/benchmarks/bandit-workload.json and its plots
(:mod:`flashspec_bench.workload`), with step costs from the H200 run's raw rows in the
git-ignored benchmarks/.results/, or from ``--costs`` (e.g. the committed result's own table).
"""

from flashspec_bench.workload import main

if __name__ == "__main__":
    raise SystemExit(main())
