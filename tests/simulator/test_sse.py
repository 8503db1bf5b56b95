"""Stream events: every chunk is one valid JSON ``data:`` event of the right object type."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from simulator.sse import ChunkEncoder, error_event


def _decode(event: bytes) -> dict[str, Any]:
    assert event.startswith(b"data: ")
    assert event.endswith(b"\n\n")
    decoded: dict[str, Any] = msgspec.json.decode(event[6:])
    return decoded


@pytest.mark.parametrize("chat", [True, False])
def test_chunks_are_valid_json(chat: bool) -> None:
    """Token, final and usage chunks decode, with escaping intact."""
    chunks = ChunkEncoder('id-"1"', 7, "m", chat=chat)
    middle = _decode(chunks.token('say "hi"\n', None))
    last = _decode(chunks.token(" end", "length"))
    usage = _decode(chunks.usage(10, 2, 8))
    assert middle["object"] == ("chat.completion.chunk" if chat else "text_completion")
    assert middle["id"] == 'id-"1"'
    choice = middle["choices"][0]
    assert (choice["delta"]["content"] if chat else choice["text"]) == 'say "hi"\n'
    assert last["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 10,
        "total_tokens": 12,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 8},
    }


def test_error_event_shape() -> None:
    """An in-stream error carries vLLM's error object."""
    assert _decode(error_event(500, "boom")) == {
        "error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
    }
