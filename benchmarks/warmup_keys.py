"""CUDA graphs the server's warm-up captures at each level, and the keys a served load asks
for that it missed, counted on the CPU (no GPU needed).

    python benchmarks/warmup_keys.py [--config flashspec_core/configs/gpu.toml] [--max-batch 64] [--levels basic,full]
                                     [--served-levels basic]

Writes docs/benchmarks/warmup-keys.json (``--out -``: prints it); see :mod:`flashspec_bench.warmup_keys`.
"""

from flashspec_bench.warmup_keys import main

if __name__ == "__main__":
    raise SystemExit(main())
