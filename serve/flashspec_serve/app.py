"""The OpenAI-compatible HTTP API over an :class:`~flashspec_serve.engine.Engine`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``. Every error is an OpenAI-style body
(``{"error": {"message", "type", "param", "code"}}``). Responses carry OpenAI's
``usage`` and a ``speculation`` block of the request's own drafting statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from flashspec_core.config import GenerationDefaults, check_prompt
from flashspec_core.contracts import HasTokenizer
from flashspec_core.pipeline import Pipeline
from flashspec_serve.engine import ContextError, Engine, EngineClosed, Event, Handle, Job, QueueFull, Speculation
from flashspec_serve.metrics import Metrics
from flashspec_serve.protocol import APIError, ChatBody, CompletionBody, Sampling, chat_messages, parse, sampling_of
from flashspec_serve.text import ChatTemplate
from flashspec_serve.warmup import LEVELS

DEFAULT_WARMUP = "basic"  # a bounded start (flashspec_serve.warmup); "full" leaves no capture to a request

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


def listening_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port) with TCP_NODELAY, for
    ``uvicorn.Server.run(sockets=[...])`` where a test or benchmark starts a server in-process.

    Without TCP_NODELAY, Nagle's algorithm holds each small write (a streamed chunk) until
    the previous one is acknowledged, and the client's delayed ACK makes that 40-200 ms per
    chunk. Neither uvicorn (0.55's h11 and httptools protocols never set the option) nor
    asyncio fixes it for such a socket: asyncio's transport sets TCP_NODELAY on an accepted
    connection only where the socket's ``proto`` is ``IPPROTO_TCP``, and
    ``socket.socket(AF_INET, SOCK_STREAM)`` has proto 0, as do the connections it accepts.
    ``flashspec serve`` is not affected: uvicorn binds host and port with
    ``loop.create_server``, whose getaddrinfo sockets have proto ``IPPROTO_TCP``. So this socket
    has proto ``IPPROTO_TCP`` too, and TCP_NODELAY set on it, which Linux copies to every
    connection it accepts (uvloop sets it on each connection itself).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def warmup_level(value: bool | str) -> str:
    """A warm-up level's name; True is :data:`DEFAULT_WARMUP`, False ``"off"``."""
    if isinstance(value, bool):
        return DEFAULT_WARMUP if value else "off"
    if value != "off" and value not in LEVELS:
        raise ValueError(f"warm-up level {value!r}: one of {', '.join([*LEVELS, 'off'])}")
    return value


@attrs.frozen
class ServeSettings:
    model_name: str
    max_batch: int = 32
    max_waiting: int = 256
    context: int | None = None  # None: the pipeline's own (Pipeline.max_context); at most that
    shutdown_grace_s: float = 10.0
    retry_after_s: int = 1
    # how much the engine warms up before the server takes requests (flashspec_serve.warmup):
    # "full", "basic" or "off"; True is the default level, False "off"
    warmup: str = attrs.field(default=DEFAULT_WARMUP, converter=warmup_level)
    seed: int | None = None  # the engine's draws for requests without a seed (None: a fresh seed each start)


def create_app(pipeline: Pipeline, settings: ServeSettings) -> FastAPI:
    """An app whose engine starts (warmed up at ``settings.warmup``'s level, unless it is off)
    with the app's lifespan and stops (gracefully) with it."""
    metrics = Metrics()
    engine = Engine(pipeline, metrics, settings.max_batch, settings.max_waiting, settings.context, seed=settings.seed)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        engine.start(warmup=settings.warmup != "off", level=settings.warmup)
        await asyncio.to_thread(engine.wait_ready)  # the server accepts no connection before this
        yield
        await asyncio.to_thread(engine.stop, settings.shutdown_grace_s)

    app = FastAPI(title="FlashSpec", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.settings = engine, metrics, settings
    api = _Api(pipeline, engine, settings)
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat)
    app.get("/v1/models")(api.models)
    app.get("/health")(api.health)
    app.get("/metrics")(lambda: Response(metrics.render(), media_type="text/plain; version=0.0.4"))
    return app


async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(APIError(exc.status_code, str(exc.detail), kind=kind).body(), status_code=exc.status_code)


class _Api:
    def __init__(self, pipeline: Pipeline, engine: Engine, settings: ServeSettings) -> None:
        self.pipeline, self.engine, self.settings = pipeline, engine, settings
        target = pipeline.target
        self.tokenizer = target.tokenizer if isinstance(target, HasTokenizer) else None
        self.chat_template = ChatTemplate.of(self.tokenizer)  # compiled once, not per request
        self.defaults = pipeline.config.generation if pipeline.config is not None else GenerationDefaults()
        self.created = int(time.time())

    async def models(self) -> dict[str, Any]:
        card = {"id": self.settings.model_name, "object": "model", "created": self.created, "owned_by": "flashspec",
                "max_model_len": self.engine.context}
        return {"object": "list", "data": [card]}

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "running": self.engine.running, "waiting": self.engine.waiting}

    async def completions(self, request: Request) -> Response:
        body: CompletionBody = parse(await request.body(), CompletionBody)
        self._check_model(body.model)
        prompt = self._completion_prompt(body.prompt)
        return await self._serve(request, body, prompt, "text_completion")

    async def chat(self, request: Request) -> Response:
        body: ChatBody = parse(await request.body(), ChatBody)
        self._check_model(body.model)
        prompt = self._chat_prompt(chat_messages(body))
        return await self._serve(request, body, prompt, "chat.completion")

    # ------------------------------------------------------------------ prompts

    def _check_model(self, model: str) -> None:
        if model != self.settings.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.settings.model_name!r}",
                           param="model", code="model_not_found", kind="not_found_error")

    def _completion_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}", param="prompt",
                               code="unsupported_parameter")
            prompt = prompt[0]
        if isinstance(prompt, str):
            _checked_text(prompt, "prompt", "prompt")
            if self.tokenizer is None:
                raise APIError(400, "this model has no tokenizer: send the prompt as a list of token ids",
                               param="prompt")
            ids = list(self.tokenizer(prompt)["input_ids"])
        else:
            ids = [int(t) for t in prompt]
        return self._checked_ids(ids)

    def _chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        for i, m in enumerate(messages):
            _checked_text(m["content"], "message content", f"messages.{i}.content")
        if self.tokenizer is None or self.chat_template is None:
            raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions", param="messages",
                           code="no_chat_template")
        text = self.chat_template.render(messages)
        return self._checked_ids(list(self.tokenizer(text, add_special_tokens=False)["input_ids"]))

    def _checked_ids(self, ids: list[int]) -> list[int]:
        vocab = self.pipeline.target.vocab
        if not ids:
            raise APIError(400, "the prompt is empty: at least one token is needed", param="prompt")
        if min(ids) < 0 or max(ids) >= vocab:
            raise APIError(400, f"prompt token ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}", param="prompt")
        return ids

    # ------------------------------------------------------------------ decoding

    def _job(self, prompt: list[int], sampling: Sampling, param: str, stream: bool) -> Job:
        try:
            room = self.engine.room(len(prompt))
        except ContextError as exc:
            raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
        wanted = sampling.max_tokens if sampling.max_tokens is not None else min(self.defaults.max_new_tokens, room)
        if wanted > room:
            raise APIError(400, f"the prompt has {len(prompt)} tokens and max_tokens is {wanted}, but the model's "
                                f"context leaves room for {room} new tokens ({self.engine.context} in all)",
                           param="max_tokens", code="context_length_exceeded")
        return Job(tuple(prompt), wanted, sampling.params, sampling.seed, sampling.stop, stream)

    def _submit(self, job: Job) -> Handle:
        try:
            return self.engine.submit(job, asyncio.get_running_loop())
        except QueueFull as exc:
            raise APIError(429, f"the server is busy: {exc}; retry later", code="rate_limit_exceeded",
                           kind="rate_limit_error", headers={"Retry-After": str(self.settings.retry_after_s)}) from None
        except EngineClosed as exc:
            raise APIError(503, str(exc), code="shutting_down", kind="server_error") from None

    async def _serve(self, request: Request, body: Any, prompt: list[int], kind: str) -> Response:
        try:
            sampling = sampling_of(body, self.defaults)
        except ValueError as exc:  # the prompt's own check
            raise APIError(400, str(exc), param="prompt") from None
        handle = self._submit(self._job(prompt, sampling, "messages" if isinstance(body, ChatBody) else "prompt",
                                        bool(body.stream)))
        reply = _Reply(kind, self.settings.model_name, len(prompt))
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(_stream(handle, reply, usage), media_type="text/event-stream")
        return JSONResponse(await _collect(request, handle, reply))


def _checked_text(text: str, label: str, param: str) -> None:
    """:func:`check_prompt` as a 400: JSON's "\\ud800" escape gives a string with a lone surrogate."""
    try:
        check_prompt(text, label)
    except ValueError as exc:
        raise APIError(400, str(exc), param=param, code="invalid_value") from None


@attrs.define
class _Reply:
    """Builds one request's response objects in OpenAI's shapes."""

    kind: str  # "text_completion" or "chat.completion"
    model: str
    prompt_tokens: int
    id: str = attrs.field(factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = attrs.field(factory=lambda: int(time.time()))
    _around: tuple[str, str] | None = attrs.field(default=None, init=False)  # text_chunk's text goes between

    @property
    def chat(self) -> bool:
        return self.kind == "chat.completion"

    def choice(self, text: str, finish: str | None, delta: bool) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        key, value = ("delta", {"content": text}) if delta else ("message", {"role": "assistant", "content": text})
        return {"index": 0, key: value, "logprobs": None, "finish_reason": finish}

    def usage(self, completion: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def whole(self, text: str, last: Event) -> dict[str, Any]:
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model,
                "choices": [self.choice(text, last.finish, delta=False)], "usage": self.usage(last.completion_tokens),
                "speculation": _speculation(last.speculation)}

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        obj = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices, **extra}
        return f"data: {json.dumps(obj)}\n\n"

    def text_chunk(self, text: str) -> str:
        """``chunk([choice(text, None, delta=True)])``, the same characters, with only ``text``
        encoded per call: a streamed request sends one such chunk per step."""
        if self._around is None:
            marker = "\x00"  # json.dumps writes it as \u0000, which no encoded text contains unescaped
            head, _, tail = self.chunk([self.choice(marker, None, delta=True)]).rpartition(json.dumps(marker))
            self._around = (head, tail)
        return json.dumps(text).join(self._around)


def _speculation(spec: Speculation | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    return {"draft_tokens": spec.draft_tokens, "accepted_tokens": spec.accepted_tokens,
            "accepted_per_position": list(spec.accepted_per_position), "steps": spec.steps}


def _failed(last: Event) -> APIError | None:
    if last.finish == "error":
        return APIError(500, f"decoding failed: {last.error}", code="engine_error", kind="server_error")
    if last.finish == "abort":
        return APIError(503, last.error or "the request was aborted", code="aborted", kind="server_error")
    return None


async def _collect(request: Request, handle: Handle, reply: _Reply) -> dict[str, Any]:
    """The whole response; a client that goes away cancels its request."""
    pieces: list[str] = []
    checked = time.monotonic()
    while True:
        try:  # wait_for makes a task per call: only where no event is there yet
            event = handle.get_nowait() or await asyncio.wait_for(handle.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            event = None
        except asyncio.CancelledError:
            handle.cancel()
            raise
        if event is not None:
            pieces.append(event.text)
            if event.finish is not None:
                break
        if time.monotonic() - checked >= DISCONNECT_POLL_S:  # events may come faster than the poll
            checked = time.monotonic()
            if await request.is_disconnected():
                handle.cancel()
                raise APIError(499, "the client closed the request", code="client_closed")
    failed = _failed(event)
    if failed is not None:
        raise failed
    return reply.whole("".join(pieces), event)


async def _stream(handle: Handle, reply: _Reply, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ``data: [DONE]`` last. Starlette cancels
    this generator when the client disconnects: the request is cancelled with it."""
    done = False
    try:
        if reply.chat:
            yield reply.chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}])
        while True:
            event = await handle.get()
            if event.finish is None:  # the common case: new text, encoded alone
                if event.text:
                    yield reply.text_chunk(event.text)
                continue
            failed = _failed(event)
            if failed is not None:
                yield f"data: {json.dumps(failed.body())}\n\n"
                break
            yield reply.chunk([reply.choice(event.text, event.finish, delta=True)],
                              speculation=_speculation(event.speculation))
            if include_usage:
                yield reply.chunk([], usage=reply.usage(event.completion_tokens))
            break
        done = True
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            handle.cancel()
