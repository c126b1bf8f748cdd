"""Per-forward time of the fast model against its bandwidth floor; writes docs/benchmarks/forward-h200.json.

    python benchmarks/forward_kernels.py [--out PATH] [--budget 200] [--commit SHA]
    python benchmarks/forward_kernels.py --smoke --out /tmp/forward.json   # tiny shapes, CPU too

Runs from a bare checkout (torch, triton, attrs and pluggy installed, the repository not):
this checkout's package folders go first on the path, ahead of any installed copy, so the
measured code is the checkout's. See :mod:`flashspec_bench.forward_kernels`.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / d) for d in (".", "benchmarks", "plugins", "kernels", "models")]

from flashspec_bench.forward_kernels import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
