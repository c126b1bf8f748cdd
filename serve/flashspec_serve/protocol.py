"""The OpenAI-compatible request bodies, their checks, and OpenAI-style errors.

A body is parsed in two passes: pydantic checks its shape (an unknown field, a wrong type),
then :func:`sampling_of` checks the sampling values with
:func:`flashspec_core.config.check_generation`, the one bounds check behind the CLI and a
config's ``[generation]`` table. Fields OpenAI defines but this server does not implement
are accepted only at their neutral value, so a client that sends the default works and one
that asks for more gets a 400 that names the field.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import attrs
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, ValidationError

from flashspec_core.config import BoundsError, GenerationDefaults, check_generation
from flashspec_core.contracts import SamplingParams

# OpenAI's name for each generation key this server shares with flashspec_core.config.
_NAMES = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
          "seed": "seed"}


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None  # not OpenAI's; vLLM's extension, -1 or 0 = off
    seed: Any = None
    n: StrictInt = 1
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: dict[str, StrictBool] | None = None
    user: str | None = None
    # OpenAI fields served only at their neutral value (see _UNSUPPORTED)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None


class CompletionBody(_Body):
    # StrictInt: pydantic would read true as token id 1
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    echo: StrictBool = False
    best_of: int | None = None
    suffix: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]
    name: str | None = None


class ChatBody(_Body):
    messages: list[Message]
    max_completion_tokens: Any = None
    top_logprobs: int | None = None


# field -> the neutral value it must keep
_UNSUPPORTED: dict[str, Any] = {
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": None, "logprobs": None, "echo": False,
    "best_of": None, "suffix": None, "top_logprobs": None,
}


def parse(raw: bytes, kind: type[_Body]) -> Any:
    """The body as ``kind``; malformed JSON, unknown fields, wrong types and unsupported
    features are an :class:`APIError` (400) naming the field."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        body = kind.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    for field, neutral in _UNSUPPORTED.items():
        value = getattr(body, field, neutral)
        if value not in (None, False) and value != neutral:
            raise APIError(400, f"{field} = {value!r} is not supported by this server", param=field,
                           code="unsupported_parameter")
    if body.n != 1:
        raise APIError(400, f"n = {body.n} is not supported: this server returns one choice per request (n = 1)",
                       param="n", code="unsupported_parameter")
    return body


# The forms a field of several types takes, for the error of a value that is none of them
# (pydantic reports one error per form, the first naming a form such as "prompt.str").
_FORMS = {"prompt": "a string, a list of token ids (integers), or a list holding one of those",
          "stop": "a string or a list of strings", "content": "a string or a list of text parts"}


def _validation_error(exc: ValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0]
    field = str(first["loc"][-2]) if len(first["loc"]) >= 2 else ""
    if field in _FORMS and len(errors) > 1:
        where = ".".join(str(p) for p in first["loc"][:-1])
        return APIError(400, f"{where} must be {_FORMS[field]}, got {_short(first.get('input'))}", param=where,
                        code="invalid_value")
    param = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}", param=param, code="unknown_field")
    if first["type"] == "missing":
        return APIError(400, f"missing required field {param!r}", param=param, code="missing_field")
    return APIError(400, f"{param}: {first['msg']} (got {first.get('input')!r})", param=param, code="invalid_value")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@attrs.frozen
class Sampling:
    """A request's checked sampling settings."""

    params: SamplingParams
    max_tokens: int | None  # None: as many as the context leaves (chat) or the config's default
    seed: int | None
    stop: tuple[str, ...]


def sampling_of(body: _Body, defaults: GenerationDefaults) -> Sampling:
    """The checked sampling settings; values the body omits come from the config's ``[generation]``."""
    given = {"temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}
    given["top_k"] = 0 if body.top_k == -1 else body.top_k  # vLLM spells "off" as -1
    given["max_new_tokens"] = body.max_tokens
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        given["max_new_tokens"] = body.max_completion_tokens
    try:
        ok = check_generation({k: v for k, v in given.items() if v is not None}, lambda key: _NAMES[key])
    except BoundsError as exc:
        raise APIError(400, str(exc), param=_NAMES[exc.key], code="invalid_value") from None
    params = SamplingParams(temperature=ok.get("temperature", defaults.temperature),
                            top_k=ok.get("top_k", defaults.top_k), top_p=ok.get("top_p", defaults.top_p))
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise APIError(400, "stop strings must not be empty", param="stop", code="invalid_value")
    return Sampling(params, ok.get("max_new_tokens"), ok.get("seed"), stop)


def chat_messages(body: ChatBody) -> list[dict[str, str]]:
    """The messages as the chat template takes them (text parts of a content list joined)."""
    out = []
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            text = m.content
        else:
            parts = []
            for part in m.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"messages[{i}].content: only text parts are supported, got {part!r}",
                                   param=f"messages.{i}.content", code="unsupported_parameter")
                parts.append(part["text"])
            text = "".join(parts)
        out.append({"role": m.role, "content": text})
    if not out:
        raise APIError(400, "messages must not be empty", param="messages", code="invalid_value")
    return out
