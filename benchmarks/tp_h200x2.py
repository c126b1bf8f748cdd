"""The fast target at one and two ranks on two H200s: docs/benchmarks/tp-h200x2.json.

    python benchmarks/tp_h200x2.py --out docs/benchmarks [--shapes qwen2.5-32b qwen2.5-14b] [--tp 1 2]
        [--acceptance 0.6 0.8] [--gammas 4] [--tokens 128] [--no-graphs] [--budget 540] [--commit SHA]

LABELLED SYNTHETIC (random weights): see :mod:`flashspec_bench.tensor_parallel`.
"""

from flashspec_bench.tensor_parallel import main

if __name__ == "__main__":
    raise SystemExit(main())
