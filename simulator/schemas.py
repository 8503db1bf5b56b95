"""Request bodies the simulator understands, and OpenAI/vLLM-shaped error bodies.

Unknown request fields are accepted and ignored, as vLLM accepts its many extensions.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class StreamOptions(msgspec.Struct):
    """``stream_options``: only ``include_usage`` changes the output."""

    include_usage: bool | None = False


class Message(msgspec.Struct):
    """One chat message; content is a string or a list of typed parts."""

    role: str
    content: str | list[Any] | None = None
    tool_calls: list[Any] | None = None


class _Typed(msgspec.Struct, kw_only=True):
    """Fields vLLM's request models type (pydantic answers 400 for a wrong type); the
    simulator does not use them, it only refuses what vLLM refuses."""

    stop: str | list[str] | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    top_k: int | None = None


class ChatRequest(_Typed):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    model: str | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: PositiveInt | None = 1
    seed: int | None = None
    cache_salt: str | None = None
    tools: list[Any] | None = None
    ignore_eos: bool | None = False
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = 0


class CompletionRequest(_Typed):
    """``POST /v1/completions``; ``prompt`` is a string or a one-element list."""

    prompt: str | list[Any]
    model: str | None = None
    max_tokens: PositiveInt | None = 16
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: PositiveInt | None = 1
    seed: int | None = None
    cache_salt: str | None = None
    ignore_eos: bool | None = False
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = 0


chat_decoder = msgspec.json.Decoder(ChatRequest)
completion_decoder = msgspec.json.Decoder(CompletionRequest)
encoder = msgspec.json.Encoder()

ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class SimError(Exception):
    """An error answered with an OpenAI-shaped body and an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        """``{"error": {"message", "type", "param", "code"}}`` with ``code`` the status."""
        return error_body(self.status, self.message, self.param)


def error_payload(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The ``error`` object vLLM puts in error responses and in-stream error events."""
    return {
        "message": message,
        "type": ERROR_TYPES.get(status, "APIError"),
        "param": param,
        "code": status,
    }


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """An encoded vLLM error response body."""
    return encoder.encode({"error": error_payload(status, message, param)})
