"""The model cache in float32 against bfloat16 on this CPU: build time, disk, load time, RAM, tokens/s.

    python benchmarks/cpu_dtype.py [--gguf-dir DIR] [--max-new-tokens 16] [--repeats 3] [--bf16-compute]

Writes docs/benchmarks/cpu-dtype.json; see :mod:`flashspec_bench.cpu_dtype`.
"""

from flashspec_bench.cpu_dtype import main

if __name__ == "__main__":
    raise SystemExit(main())
