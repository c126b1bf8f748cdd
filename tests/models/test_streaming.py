"""flashspec_models.streaming: safetensors read a chunk at a time into any dtype, and the
back-ends' loads of a bfloat16 checkpoint into float32 through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _tiny import tiny_lm
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from flashspec_fast.model import ModelArgs, load_weights, read_config
from flashspec_hf import loading
from flashspec_hf.loading import ModelOptions, load_model, load_upcast, widens
from flashspec_models import streaming
from flashspec_models.streaming import Checkpoint

CPU = torch.device("cpu")


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 40 bytes: every tensor below spans several, the last one short."""
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 40)


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"a": torch.randn(7, 5, generator=gen).to(torch.bfloat16), "b": torch.randn(3, generator=gen).to(torch.bfloat16),
            "c": torch.arange(6, dtype=torch.int64).view(2, 3), "empty": torch.zeros(0, 4, dtype=torch.bfloat16)}


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_read_gives_the_stored_values_converted_exactly(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    ckpt = Checkpoint(tmp_path)
    assert set(ckpt) == set(tensors) and ckpt.float_dtypes() == {torch.bfloat16}
    for name, t in tensors.items():
        got = ckpt.read(name, dtype)
        assert got.dtype == dtype and torch.equal(got, t.to(dtype)), name


def test_read_into_a_slice_of_a_bigger_tensor(tmp_path: Path) -> None:
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    out = torch.full((9, 5), -1.0)
    Checkpoint(tmp_path).read_into("a", out[1:8])
    assert torch.equal(out[1:8], tensors["a"].float()) and bool((out[0] == -1).all()) and bool((out[8] == -1).all())


def test_tensors_of_several_files_are_found_and_a_name_in_two_is_refused(tmp_path: Path) -> None:
    save_file({"x": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"y": torch.zeros(3)}, tmp_path / "model-00002-of-00002.safetensors")
    ckpt = Checkpoint(tmp_path)
    assert torch.equal(ckpt.read("y", torch.float64), torch.zeros(3, dtype=torch.float64))
    save_file({"x": torch.ones(2)}, tmp_path / "model-extra.safetensors")
    with pytest.raises(ValueError, match="'x' is in both"):
        Checkpoint(tmp_path)


def test_errors_name_the_file_and_the_tensor(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        Checkpoint(tmp_path)
    save_file(_tensors(), tmp_path / "model.safetensors")
    ckpt = Checkpoint(tmp_path)
    with pytest.raises(KeyError, match="missing tensor 'nope'"):
        ckpt.read("nope", torch.float32)
    with pytest.raises(ValueError, match="'a' has shape \\[7, 5\\], its destination \\[5, 7\\]"):
        ckpt.read_into("a", torch.empty(5, 7))
    with pytest.raises(ValueError, match="must be contiguous"):
        ckpt.read_into("a", torch.empty(5, 7).t())
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-8])  # cuts into the last tensor's bytes
    cut = Checkpoint(tmp_path)
    last = max((n for n in cut if cut.entry(n).numel), key=lambda n: cut.entry(n).end)
    with pytest.raises(ValueError, match=f"ends inside tensor '{last}'"):
        cut.read(last, torch.float32)


def test_a_header_that_lies_about_a_size_is_refused(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 6]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(6))
    with pytest.raises(ValueError, match="'w' spans 6 bytes, not the 8"):
        Checkpoint(tmp_path)
    header = json.dumps({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    with pytest.raises(ValueError, match="dtype 'F8_E4M3'"):
        Checkpoint(tmp_path)


# --- the back-ends ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("bf16") / "m", vocab=16, hidden=64, init=0.3, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def tied_bf16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tiny_lm(tmp_path_factory.mktemp("tied") / "m", vocab=16, hidden=64, init=0.3, dtype=torch.bfloat16)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tensors = load_file(path / "model.safetensors")
    del tensors["lm_head.weight"]  # what save_pretrained writes for a tied model
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("which", ["bf16_model", "tied_bf16_model"])
def test_hf_upcast_holds_the_cached_bfloat16_values_and_matches_from_pretrained(
    which: str, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(which)
    cached = load_file(path / "model.safetensors")
    assert widens(path, torch.float32) and not widens(path, torch.bfloat16)
    model = load_upcast(path, torch.float32)
    assert model is not None
    state = model.state_dict()
    for name, tensor in cached.items():
        assert state[name].dtype == torch.float32 and torch.equal(state[name], tensor.float()), name
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == (which == "tied_bf16_model")
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert state.keys() == reference.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(state[name], tensor), name
    for (name, buffer), (_, want) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        assert buffer.dtype == want.dtype and torch.equal(buffer, want), name  # rotary tables computed alike
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(model.eval().generate(ids, max_new_tokens=6, do_sample=False),
                           reference.eval().generate(ids, max_new_tokens=6, do_sample=False))


def test_load_model_streams_only_a_narrower_cache(bf16_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[torch.dtype] = []
    real = loading.load_upcast

    def spy(path: Path, dtype: torch.dtype, attn_implementation: str = "sdpa") -> object:
        calls.append(dtype)
        return real(path, dtype, attn_implementation)

    monkeypatch.setattr(loading, "load_upcast", spy)
    model, _ = load_model(ModelOptions(model=str(bf16_model), dtype="float32", device="cpu"))
    assert calls == [torch.float32] and model.dtype == torch.float32 and not model.training
    model, _ = load_model(ModelOptions(model=str(bf16_model), dtype="bfloat16", device="cpu"))
    assert calls == [torch.float32] and model.dtype == torch.bfloat16  # same width: from_pretrained


def test_hf_upcast_leaves_a_foreign_naming_to_from_pretrained(bf16_model: Path, tmp_path: Path) -> None:
    for f in bf16_model.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k.replace("model.", "transformer.", 1): v for k, v in tensors.items()}, tmp_path / "model.safetensors")
    assert load_upcast(tmp_path, torch.float32) is None


@pytest.mark.usefixtures("small_chunks")
def test_fast_weights_from_a_bfloat16_cache_are_its_values_in_float32(bf16_model: Path) -> None:
    cached = {k.removeprefix("model."): v.float() for k, v in load_file(bf16_model / "model.safetensors").items()}
    args = ModelArgs.from_hf(read_config(bf16_model))
    w = load_weights(bf16_model, args, torch.float32, CPU)
    layer, p = w.layers[1], "layers.1."
    assert torch.equal(layer.wqkv, torch.cat([cached[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
    assert layer.bqkv is not None
    assert torch.equal(layer.bqkv, torch.cat([cached[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]))
    assert torch.equal(layer.w_gate_up, torch.cat([cached[p + "mlp.gate_proj.weight"], cached[p + "mlp.up_proj.weight"]]))
    assert torch.equal(layer.w_down, cached[p + "mlp.down_proj.weight"])
    assert torch.equal(w.embed, cached["embed_tokens.weight"]) and torch.equal(w.lm_head, cached["lm_head.weight"])
    assert torch.equal(w.norm, cached["norm.weight"]) and w.embed.dtype == torch.float32


def test_fast_weights_of_a_tied_checkpoint_share_the_embedding(tied_bf16_model: Path) -> None:
    args = ModelArgs.from_hf(read_config(tied_bf16_model))
    w = load_weights(tied_bf16_model, args, torch.float32, CPU)
    assert w.lm_head is w.embed
