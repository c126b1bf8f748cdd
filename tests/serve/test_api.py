"""The OpenAI-compatible API against a tiny pipeline: the openai client, curl, errors, metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import MODEL, Server, make_pipeline, serve

from flashspec_core.contracts import RowSampling, SamplingParams
from flashspec_core.pipeline import Pipeline

openai = pytest.importorskip("openai")

PROMPT = "t1 t2 t3"


@pytest.fixture(scope="module")
def alone(tiny_models: dict[str, Path]) -> Pipeline:
    """The same pipeline, for what a prompt gets when it runs alone."""
    return make_pipeline(tiny_models)


@pytest.fixture()
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_completion_equals_the_pipeline_alone(client: openai.OpenAI, alone: Pipeline) -> None:
    want = alone.generate([PROMPT], max_new_tokens=12, temperature=0.0)
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert got.choices[0].text == want.texts[0]
    assert got.choices[0].finish_reason in ("length", "stop")
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (3, len(want.token_ids[0]))
    spec = got.model_extra["speculation"]
    assert spec["accepted_tokens"] == sum(spec["accepted_per_position"][:1]) + sum(spec["accepted_per_position"][1:])
    assert spec["draft_tokens"] == 3 * spec["steps"]  # the fixed selector plays d0 (gamma 3) on every step
    assert spec["accepted_tokens"] + spec["steps"] >= len(want.token_ids[0])


def test_streamed_completion_and_chat(client: openai.OpenAI, alone: Pipeline) -> None:
    want = alone.generate([PROMPT], max_new_tokens=16, temperature=0.0).texts[0]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason is not None
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=16, temperature=0)
    assert whole.choices[0].message.content == want and whole.choices[0].message.role == "assistant"


def test_stop_strings_end_the_text(client: openai.OpenAI, alone: Pipeline) -> None:
    want = alone.generate([PROMPT], max_new_tokens=16, temperature=0.0).texts[0]
    stop = want.split()[4]  # a word that occurs in the continuation
    cut = want[: want.index(" " + stop)]
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[" " + stop])
    assert (got.choices[0].text, got.choices[0].finish_reason) == (cut, "stop")
    chunks = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=" " + stop,
                                       stream=True)
    assert "".join(c.choices[0].text for c in chunks) == cut


def test_a_seeded_request_is_reproducible(client: openai.OpenAI, alone: Pipeline) -> None:
    args = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 1234}
    texts = {client.completions.create(**args).choices[0].text for _ in range(3)}  # type: ignore[call-overload]
    rows = RowSampling([SamplingParams(temperature=1.0)], seeds=[1234])
    assert texts == {alone.generate([PROMPT], max_new_tokens=12, rows=rows).texts[0]}


def test_the_servers_seed_makes_unseeded_requests_reproducible(tiny_models: dict[str, Path]) -> None:
    """``flashspec serve --seed`` (ServeSettings.seed): a request without a seed of its own gets
    the same tokens from two servers started with the same seed, others from another seed."""
    args = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0}
    texts = []
    for seed in (7, 7, 8):
        srv = serve(make_pipeline(tiny_models), seed=seed)
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
            texts.append(client.completions.create(**args).choices[0].text)  # type: ignore[call-overload]
        finally:
            srv.stop()
    assert texts[0] == texts[1] and texts[2] != texts[0]


def test_models_and_health(server: Server) -> None:
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL] and models["data"][0]["max_model_len"] == 512
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


@pytest.mark.parametrize(("body", "status", "param", "words"), [
    (b"{not json", 400, None, "not valid JSON"),
    (b"[1, 2]", 400, None, "JSON object"),
    ({"model": MODEL, "prompt": PROMPT, "best_temperature": 1}, 400, "best_temperature", "unknown field"),
    ({"model": MODEL}, 400, "prompt", "missing"),
    ({"model": MODEL, "prompt": PROMPT, "top_p": 1.5}, 400, "top_p", "(0, 1]"),
    ({"model": MODEL, "prompt": PROMPT, "temperature": -1}, 400, "temperature", ">= 0"),
    ({"model": MODEL, "prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"model": MODEL, "prompt": PROMPT, "seed": "x"}, 400, "seed", "integer"),
    ({"model": MODEL, "prompt": PROMPT, "n": 2}, 400, "n", "n = 1"),
    ({"model": MODEL, "prompt": PROMPT, "logprobs": 3}, 400, "logprobs", "not supported"),
    ({"model": MODEL, "prompt": PROMPT, "stream": "yes"}, 400, "stream", "stream"),
    ({"model": "gpt-4", "prompt": PROMPT}, 404, "model", "'tiny'"),
    ({"model": MODEL, "prompt": "t1 " * 600}, 400, "prompt", "600 tokens"),
    ({"model": MODEL, "prompt": PROMPT, "max_tokens": 10_000}, 400, "max_tokens", "10000"),
    ({"model": MODEL, "prompt": [1, 99]}, 400, "prompt", "[0, 16)"),
    ({"model": MODEL, "prompt": [True, 2]}, 400, "prompt", "a list of token ids (integers)"),  # not token id 1
    ({"model": MODEL, "prompt": [[1, False]]}, 400, "prompt", "got [[1, False]]"),
    ({"model": MODEL, "prompt": PROMPT, "stop": 3}, 400, "stop", "stop must be a string or a list of strings, got 3"),
    (b'{"model": "tiny", "prompt": "t1 \\ud800"}', 400, "prompt", "not valid UTF-8 (lone surrogate U+D800 at character 3)"),
])
def test_errors_are_openai_bodies(server: Server, body: object, status: int, param: str | None, words: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + "/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"], error


def test_too_long_chat_names_both_lengths(server: Server) -> None:
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": [{"role": "user", "content": "t2 " * 700}]})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "700 tokens" in message and "512 tokens" in message


def test_openai_client_raises_on_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model=MODEL, prompt=PROMPT, top_p=2.0)


def test_metrics_count_what_requests_report(tiny_models: dict[str, Path]) -> None:
    srv = serve(make_pipeline(tiny_models))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        specs = [c.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0).model_extra["speculation"]
                 for p in (PROMPT, "t5 t6")]
        text = httpx.get(srv.url + "/metrics").text
    finally:
        srv.stop()
    values = _samples(text)
    assert values["flashspec:spec_decode_num_draft_tokens_total"] == sum(s["draft_tokens"] for s in specs)
    assert values["flashspec:spec_decode_num_accepted_tokens_total"] == sum(s["accepted_tokens"] for s in specs)
    assert values["flashspec:spec_decode_num_drafts_total"] == sum(s["steps"] for s in specs)
    assert values['flashspec:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == sum(
        s["accepted_per_position"][0] for s in specs)
    assert values['flashspec:spec_decode_arm_selections_total{arm="d0"}'] == sum(s["steps"] for s in specs)
    assert values["flashspec:generation_tokens_total"] == 20
    assert values["flashspec:time_to_first_token_seconds_count"] == 2
    assert values["flashspec:num_requests_running"] == 0


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl(server: Server, alone: Pipeline) -> None:
    want = alone.generate([PROMPT], max_new_tokens=8, temperature=0.0).texts[0]
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    run = ["curl", "-sS", "--max-time", "30", "-H", "Content-Type: application/json", "-d"]
    out = subprocess.run([*run, body, server.url + "/v1/completions"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["choices"][0]["text"] == want
    stream = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True})
    out = subprocess.run([*run, stream, "-N", server.url + "/v1/completions"], capture_output=True, text=True,
                         check=True)
    events = [line[len("data: "):] for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == want
