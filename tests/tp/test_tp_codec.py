"""The tensor-parallel command codec: what rank 0 sends its workers is data (JSON and raw
tensor bytes), never pickle, and reads back exactly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from flashspec_fast.tp import OnDevice, pack_calls, unpack_calls

ROOT = Path(__file__).resolve().parents[2]


def test_every_replayed_call_round_trips() -> None:
    tokens = torch.randint(0, 50_000, (3, 7))
    parents = torch.tensor([-1, 0, 0, 1])
    paths = torch.tensor([[0, 1, -1], [2, -1, -1], [-1, -1, -1]])
    device = torch.ones((3, 4), dtype=torch.long)  # stands for a CUDA tensor: it travels apart
    calls = [("prefill", (tokens, [7, 5, 3])), ("prefill_rows", (tokens, [7, 5, 3], [1])),
             ("score_tree", (tokens, [7, 5, 3], device, parents)), ("commit_path", (paths,)),
             ("rollback", ([2, 0, 1],)), ("score", (tokens[:, :0], [1, 1, 1], device)), ("stop", ())]
    got = unpack_calls(pack_calls(calls, [device]))
    assert [name for name, _ in got] == [name for name, _ in calls]
    for (_, want), (_, args) in zip(calls, got, strict=True):
        assert len(args) == len(want)
        for w, a in zip(want, args, strict=True):
            if w is device:
                assert a == OnDevice((3, 4), torch.int64)
            elif isinstance(w, torch.Tensor):
                assert a.dtype == w.dtype and torch.equal(a, w)
            else:
                assert a == list(w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.bool, torch.int32])
def test_tensors_of_other_dtypes_keep_their_bits(dtype: torch.dtype) -> None:
    t = (torch.randn(2, 5) * 100).to(dtype)
    (_, (got,)), = unpack_calls(pack_calls([("x", (t,))]))
    assert got.dtype == dtype and torch.equal(got, t)


def test_what_cannot_travel_is_named_and_a_bad_message_is_refused() -> None:
    with pytest.raises(TypeError, match="argument of type dict"):
        pack_calls([("rollback", ({"a": 1},))])
    with pytest.raises(TypeError, match="complex64"):
        pack_calls([("x", (torch.zeros(2, dtype=torch.complex64),))])
    data = pack_calls([("x", (torch.zeros(2),))])
    size = int.from_bytes(data[:8].numpy().tobytes(), "little")
    header = data[8 : 8 + size].numpy().tobytes().replace(b'"float32"', b'"float99"')
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        unpack_calls(torch.cat([data[:8], torch.frombuffer(bytearray(header), dtype=torch.uint8), data[8 + size :]]))


def test_no_shipped_code_unpickles_or_loads_torch_pickles() -> None:
    """Security basics: no pickle and no ``torch.load`` in what users install."""
    bad = re.compile(r"^\s*(import pickle|from pickle|import cPickle)|pickle\.loads?\(|torch\.load\(", re.M)
    found = [str(p.relative_to(ROOT)) for d in ("flashspec_core", "plugins", "serve", "models", "kernels")
             for p in (ROOT / d).rglob("*.py") if bad.search(p.read_text())]
    assert found == []
