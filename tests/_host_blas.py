"""Whether this host can show the decode kernel's bit-for-bit width invariance at all.

Under ``TRITON_INTERPRET=1`` every ``tl.dot`` is a numpy matmul. The kernel keeps one dot
shape for every width (``BLOCK_M`` rows per tile), so a query's bits cannot depend on the
width on the GPU; in the interpreter they can still depend on where its row sits in the
tile, if the host BLAS sums a row differently by row position. OpenBLAS 0.3.30 does on
some CPUs (seen on an AVX2 AMD EPYC, not on the machine CI had before): there the tests
check the same outputs to float32 rounding instead, and the bit-for-bit property rests on
the GPU check (``benchmarks/width_invariance.py``, ``docs/benchmarks/width-invariance-h200*.json``).
"""

from __future__ import annotations

import functools

import numpy as np

from flashspec_kernels.attention import BLOCK_M, BLOCK_N


@functools.cache
def dot_rows_position_invariant(rows: int = BLOCK_M, inner: int = 64, cols: int = BLOCK_N) -> bool:
    """True when numpy's float32 matmul gives a row the same bits at every row position, for
    the kernel's tile (``BLOCK_M`` query rows against ``BLOCK_N`` slots; 64 = the draft's head dim)."""
    rng = np.random.default_rng(0)
    b = rng.standard_normal((inner, cols)).astype(np.float32)
    x = rng.standard_normal(inner).astype(np.float32)
    first = None
    for i in range(rows):
        a = rng.standard_normal((rows, inner)).astype(np.float32)
        a[i] = x
        got = (a @ b)[i]
        if first is None:
            first = got
        elif not np.array_equal(first, got):
            return False
    return True
