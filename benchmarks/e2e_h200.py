"""End-to-end benchmark on one H200: the committed docs/benchmarks/e2e-h200.json.

    python benchmarks/e2e_h200.py smoke --out DIR
    python benchmarks/e2e_h200.py full --gguf DIR --out DIR --budget 480 [--sections ...]
    python benchmarks/e2e_h200.py summarize --from DIR --out docs/benchmarks --commit SHA [--merge E2E_JSON]

The sections live in :mod:`flashspec_bench.sections`, the summary in :mod:`flashspec_bench.e2e`;
``summarize`` leaves the raw rows in the git-ignored ``benchmarks/.results/``.
"""

from flashspec_bench.sections import main

if __name__ == "__main__":
    raise SystemExit(main())
