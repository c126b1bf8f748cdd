import os

# Installed third-party plugins must not change what the tests see.
os.environ.setdefault("FLASHSPEC_DISABLE_PLUGIN_AUTOLOAD", "1")
# Without a GPU, Triton kernels run in the interpreter on CPU tensors.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
