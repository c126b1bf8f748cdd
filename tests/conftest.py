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

# tox runs the statistical suite per plugin combination by naming the verifiers and
# selectors to keep (comma-separated); unset means all. Only bundled names are
# filtered: test-only components (e.g. adversarial selectors) always run.
_FILTERS = {
    "verifier": ("FLASHSPEC_TEST_VERIFIERS", {"reference", "triton", "synthetic"}),
    "selector": (
        "FLASHSPEC_TEST_SELECTORS",
        {"fixed", "ucb1", "thompson", "sliding_window_ucb", "discounted_thompson", "glr_thompson", "request_thompson"},
    ),
}


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(_filtered_out(key, params.get(key)) for key in _FILTERS):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _filtered_out(key: str, value: object) -> bool:
    env, bundled = _FILTERS[key]
    wanted = os.environ.get(env)
    return bool(wanted) and value in bundled and value not in wanted.split(",")
