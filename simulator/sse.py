"""Server-sent event chunks for streaming chat and text completions, as vLLM emits them."""

from __future__ import annotations

from typing import Any

from simulator.schemas import encoder, error_payload

DONE = b"data: [DONE]\n\n"
_TAIL = b"]}\n\n"
_CHAT_DELTA = b'{"index":0,"delta":{"content":'
_TEXT_DELTA = b'{"index":0,"text":'
_OPEN_TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n'


def usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """The ``usage`` object; ``prompt_tokens_details.cached_tokens`` only when ``cached``.

    vLLM reports cached tokens only with ``--enable-prompt-tokens-details`` and only when
    some were cached; streams then leave the field out (``exclude_unset``).
    """
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


class ChunkEncoder:
    """Encodes the events of one stream; the constant head of each chunk is encoded once."""

    __slots__ = ("_chat", "_field", "_head", "_thinking")

    def __init__(self, response_id: str, created: int, model: str, *, chat: bool) -> None:
        self._chat = chat
        self._thinking, self._field = 0, "reasoning"
        kind = b"chat.completion.chunk" if chat else b"text_completion"
        self._head = (
            b'data: {"id":'
            + encoder.encode(response_id)
            + b',"object":"'
            + kind
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + encoder.encode(model)
            + b',"choices":['
        )

    def role(self) -> bytes:
        """The first chat chunk: the assistant role and empty content."""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._head + encoder.encode(choice) + _TAIL

    def think(self, tokens: int, field: str) -> None:
        """Send the next ``tokens`` tokens as thinking, in ``field`` (a reasoning model)."""
        self._thinking, self._field = tokens, field

    def token(self, text: str, finish_reason: str | None) -> bytes:
        """One token (thinking while any is left); the last one carries the finish reason."""
        if self._thinking:
            self._thinking -= 1
            return self.thought(text, self._field, finish_reason)
        if finish_reason is None:
            # The hot path: a fixed byte template around the encoded text.
            if self._chat:
                return self._head + _CHAT_DELTA + encoder.encode(text) + b"}" + _OPEN_TAIL
            return self._head + _TEXT_DELTA + encoder.encode(text) + _OPEN_TAIL
        choice: dict[str, Any]
        if self._chat:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = None
        return self._head + encoder.encode(choice) + _TAIL

    def thought(self, text: str, field: str, finish_reason: str | None) -> bytes:
        """One token of thinking (``field``: ``reasoning_content`` or ``reasoning``), no
        ``content``, as vLLM's reasoning parser streams it."""
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {field: text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = None
        return self._head + encoder.encode(choice) + _TAIL

    def usage(self, prompt: int, completion: int, cached: int | None) -> bytes:
        """The ``include_usage`` chunk: no choices, only usage."""
        return (
            self._head
            + b'],"usage":'
            + encoder.encode(usage(prompt, completion, cached))
            + b"}\n\n"
        )


def error_event(status: int, message: str) -> bytes:
    """An error reported inside a stream that already answered 200."""
    return b"data: " + encoder.encode({"error": error_payload(status, message)}) + b"\n\n"
