"""Accepted tokens per target forward: chains, static trees and dynamic trees, on this CPU.

    python benchmarks/tree_shapes.py [--prompts 2] [--max-new-tokens 48] [--arms chain-g3,static-3-2-1]

Writes docs/benchmarks/tree-shapes-cpu.json (``--out -``: prints it); see :mod:`flashspec_bench.tree_shapes`.
"""

from flashspec_bench.tree_shapes import main

if __name__ == "__main__":
    raise SystemExit(main())
