"""Check and time the Triton verifier against the reference on one CUDA GPU.

    python benchmarks/verify_kernels.py --out DIR [--commit SHA] [--quick] [--skip checks,timing]

Writes DIR/verify-kernels-h200.json; see :mod:`flashspec_bench.verify`.
"""

from flashspec_bench.verify import main

if __name__ == "__main__":
    raise SystemExit(main())
