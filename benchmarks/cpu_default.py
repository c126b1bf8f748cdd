"""The bundled default config against target-only decoding, side by side on this CPU.

    python benchmarks/cpu_default.py [--max-new-tokens 64] [--repeats 2] [--prompts 3]
    python benchmarks/cpu_default.py --smoke   # the default config on the tiny random models

Writes docs/benchmarks/cpu-default.json (with --smoke: benchmarks/.results/cpu-default-smoke.json);
see :mod:`flashspec_bench.cpu_default`.
"""

from flashspec_bench.cpu_default import main

if __name__ == "__main__":
    raise SystemExit(main())
