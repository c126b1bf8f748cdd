"""Power of the pipeline-level exactness gate against planted pipeline bugs.

    python benchmarks/pipeline_power.py [--seeds 10]

Writes docs/benchmarks/pipeline-power.json; see :mod:`flashspec_bench.power`.
"""

from flashspec_bench.power import pipeline_main

if __name__ == "__main__":
    raise SystemExit(pipeline_main())
