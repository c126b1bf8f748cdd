"""Run time of the statistical suite (``pytest -m stats``); writes stats-suite-time.json.

    python benchmarks/suite_time.py [--out docs/benchmarks] [-- extra pytest args]

Runs the suite once in a subprocess, as CI does (every verifier and selector in one
process, Triton in its interpreter on a machine without a GPU), and records the wall
time, each test's duration (pytest's ``--durations=0`` report), the outcome counts,
the machine's CPU count and the package versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATION = re.compile(r"^\s*([0-9.]+)s (call|setup|teardown)\s+(\S+)")
OUTCOME = re.compile(r"(\d+) (passed|failed|skipped|deselected|error|errors)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args, extra = p.parse_known_args()
    cmd = [sys.executable, "-m", "pytest", "-m", "stats", "-q", "--durations=0", "-p", "no:cacheprovider", *extra]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    tests: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        m = DURATION.match(line)
        if m:
            tests[m.group(3)] = tests.get(m.group(3), 0.0) + float(m.group(1))
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    import torch
    import triton

    result = {
        "command": " ".join(cmd[1:]),
        "returncode": proc.returncode,
        "wall_seconds": wall,
        "outcomes": {k: int(n) for n, k in OUTCOME.findall(tail)},
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "1" if not torch.cuda.is_available() else "0"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                 check=False).stdout.strip() or None,
        "seconds_by_file": {},
        "seconds_by_test": dict(sorted(tests.items(), key=lambda kv: -kv[1])),
    }
    for name, sec in tests.items():
        f = name.split("::")[0]
        result["seconds_by_file"][f] = result["seconds_by_file"].get(f, 0.0) + sec
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "stats-suite-time.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"{tail}\nwall {wall:.0f} s -> {path}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
