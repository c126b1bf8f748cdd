"""Wall time, peak memory and disk of README's test command on this machine; writes docs/benchmarks/test-suite-cpu.json.

    python benchmarks/suite_time.py [--quick-only] [--out PATH]

Runs, from the repository root and in this venv, the full suite (``pytest``, what CI runs)
and README's quicker subset (``pytest --ignore=tests/stats``), one after the other, and
records for each the wall time, the tests passed / failed / skipped (pytest's summary line),
the peak resident memory of the pytest process, and the machine's load before and after
(a busy machine runs it slower: say so beside the numbers). The venv's disk use is measured
once. Run it from a clean clone with its own venv, so the numbers are the checkout's.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

from flashspec_bench.provenance import DOCS, logger, provenance, write_json  # noqa: E402

say = logger("suite")
COMMANDS = {"full": ["pytest"], "quick": ["pytest", "--ignore=tests/stats"]}


def counts(summary: str) -> dict[str, int]:
    """``{"passed": 1610, "skipped": 12, ...}`` from pytest's last line."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|xfailed|errors?)", summary)}


def run(name: str, cmd: list[str]) -> dict[str, object]:
    before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *cmd, "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    tail = [line for line in proc.stdout.strip().splitlines() if line.strip()][-1:] or [""]
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far
    row = {"command": " ".join(cmd), "rc": proc.returncode, "seconds": round(seconds, 1), "counts": counts(tail[0]),
           "summary_line": tail[0],
           "not_passed": [line[:200] for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))],
           "peak_rss_gib_so_far": round(peak_kib / 2**20, 2),
           "load_before": [round(x, 2) for x in before], "load_after": [round(x, 2) for x in os.getloadavg()]}
    say(f"{name}: rc {proc.returncode}, {seconds / 60:.1f} min, {tail[0]}")
    return row


def du_gib(path: Path) -> float | None:
    if not path.exists():
        return None
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()
    return round(int(out[0]) / 2**30, 2) if out else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DOCS / "test-suite-cpu.json")
    p.add_argument("--quick-only", action="store_true", help="only README's quicker subset")
    args = p.parse_args(argv)
    os.environ.setdefault("FLASHSPEC_DISABLE_PLUGIN_AUTOLOAD", "1")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    names = ["quick"] if args.quick_only else ["quick", "full"]
    rows = {name: run(name, COMMANDS[name]) for name in names}
    result = {**provenance("benchmarks/suite_time.py"), "cores": os.cpu_count(),
              "venv_gib": du_gib(Path(sys.prefix)), "runs": rows,
              "note": "peak_rss_gib_so_far: the largest pytest process up to and including that run"}
    say(f"wrote {write_json(args.out, result)}")
    return 0 if all(r["rc"] == 0 for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
