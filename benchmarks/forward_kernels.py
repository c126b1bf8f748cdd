"""Per-forward time of the fast model against its bandwidth floor; writes docs/benchmarks/forward-h200.json.

    python benchmarks/forward_kernels.py [--out PATH] [--budget 200] [--commit SHA]
    python benchmarks/forward_kernels.py --smoke --out /tmp/forward.json   # tiny shapes, CPU too

Runs from a bare checkout (torch and triton installed, the repository not): the package
folders are put on the path. See :mod:`flashspec_bench.forward_kernels`.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path += [str(ROOT / d) for d in (".", "benchmarks", "plugins", "kernels", "models") if str(ROOT / d) not in sys.path]

from flashspec_bench.forward_kernels import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
