"""benchmarks/width_invariance.py on a tiny random checkpoint (CPU, float32, the kernel in Triton's interpreter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _host_blas import dot_rows_position_invariant
from _scripts import load_benchmark
from _tiny import tiny_lm

wi = load_benchmark("width_invariance")


def test_compare_counts_rows_and_finds_one_changed_element() -> None:
    alone = torch.arange(12, dtype=torch.float32).view(3, 4)
    wide = alone.clone()
    wide[1, 2] += 0.5
    got = wi.compare(alone, wide)
    assert got == {"rows": 3, "bit_equal_rows": 2, "max_abs_diff": 0.5, "argmax_equal_rows": 3}
    wide[2, 0] = 100.0  # now row 2's argmax moves too
    assert wi.compare(alone, wide)["argmax_equal_rows"] == 2
    with pytest.raises(ValueError, match=r"shapes \(3, 4\) and \(2, 4\)"):
        wi.compare(alone, wide[:2])


def assert_width_invariant(table: dict[str, dict[str, float]]) -> None:
    """Each width's row count, and its rows equal to the one-token pass: bit for bit where the
    host BLAS can show it (tests/_host_blas.py), else to float32 rounding."""
    assert all(v["rows"] == int(k) for k, v in table.items())
    if dot_rows_position_invariant():
        assert all(v["bit_equal_rows"] == v["rows"] for v in table.values())
    else:
        assert all(v["max_abs_diff"] < 1e-5 for v in table.values())


def test_run_writes_both_tables(tmp_path: Path) -> None:
    model = tiny_lm(tmp_path / "m", vocab=16, seed=0, scale=8.0)
    out = tmp_path / "out"
    assert wi.main(["--model", str(model), "--dtype", "fp32", "--device", "cpu", "--prefix", "20",
                    "--positions", "6", "--widths", "2,4", "--max-len", "64", "--out", str(out),
                    "--paths", "sdpa,decode_kernel"]) == 0
    data = json.loads((out / "width-invariance-cpu.json").read_text())
    assert list(data["logits"]) == ["sdpa", "decode_kernel"]  # in the order asked for
    for table in data["logits"].values():
        # the same one-token pass twice from the same cache: on the CPU the bits repeat
        assert table["one_token_pass_repeated"]["bit_equal_rows"] == table["one_token_pass_repeated"]["rows"] == 6
        for k in (2, 4):
            windows = 6 - k + 1
            assert table[str(k)]["last_row"]["rows"] == windows
            assert table[str(k)]["every_row"]["rows"] == windows * k
    attention = next(v for n, v in data["pieces"].items() if n.startswith("decode_attention"))
    # the kernel's own promise, checked here in the interpreter: a query's bits do not depend on the width
    # (bit for bit where the host BLAS allows it, tests/_host_blas.py; else to float32 rounding)
    assert_width_invariant(attention)
    for name in ("rms_norm [1, T, dim] (compiled if fuse)", "silu_mul [1, T, 2 ffn] (compiled if fuse)"):
        assert set(data["pieces"][name]) == {"2", "4"}  # as the forward passes them; row-wise ops on the CPU
        assert all(v["bit_equal_rows"] == v["rows"] == 1 for v in data["pieces"][name].values())
    spans = data["pieces"]["decode_attention, each at its own span (across a power of two)"]
    assert_width_invariant(spans)  # split counts differ there
    depth = data["depth"]
    assert depth["width"] == 4 and list(depth["by_layers"]) == ["1", "2"]  # the tiny model has two layers
    assert all(v["rows"] == (6 - 4 + 1) * 4 for v in depth["by_layers"].values())
    assert data["config"]["fuse"] is False and data["commit"]
    assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize(("args", "match"), [
    (["--widths", "1,4"], "each must be 2..16"),
    (["--prefix", "60"], "must stay below max_len 64"),
    (["--paths", "sdpa"], "decode_kernel and sdpa once each"),
])
def test_bad_input_is_a_clear_error(tmp_path: Path, args: list[str], match: str) -> None:
    model = tiny_lm(tmp_path / "m", vocab=16, seed=0, scale=8.0)
    with pytest.raises((SystemExit, ValueError), match=match):
        wi.main(["--model", str(model), "--dtype", "fp32", "--device", "cpu", "--max-len", "64",
                 "--out", str(tmp_path / "o"), *args])


def test_a_folder_without_a_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no config.json"):
        wi.main(["--model", str(tmp_path), "--device", "cpu", "--out", str(tmp_path / "o")])
