"""Measure the verifier exactness gate: power against planted bugs, false alarms, calibration.

    python benchmarks/exactness_power.py [--seeds 300] [--null-seeds 400] [--workers 2]

Writes docs/benchmarks/exactness-power.json (a few minutes on 2 CPU cores); see
:mod:`flashspec_bench.power`.
"""

from flashspec_bench.power import exactness_main

if __name__ == "__main__":
    raise SystemExit(exactness_main())
