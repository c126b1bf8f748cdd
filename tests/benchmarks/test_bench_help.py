"""`flashspec bench --help` describes every option (docs/faults.md says so)."""

from __future__ import annotations

from flashspec_bench.harness import parser


def test_every_bench_option_has_a_description() -> None:
    undescribed = [a.option_strings for a in parser()._actions if not a.help]
    assert undescribed == []
