"""A non-streaming answer's usage, read without decoding the rest: the same counts as a full
decode for every shape a backend may send, and None where there are none."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from gateway.composition import create_app
from gateway.config.settings import AuthSettings, Settings
from gateway.config.tier_settings import TierSettings
from gateway.pipeline.events import Usage
from gateway.upstream.attempt import (
    AttemptFailed,
    Opened,
    answer_usage,
    usage_fields,
    usage_from,
    whole_usage,
)

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": 'a "usage": trap'}}],
}


def usage_of_answer(raw: bytes) -> Usage | None:
    """The usage the gateway settles for a non-streaming answer (None: it has none; an answer
    that is not JSON fails its attempt instead, and settles nothing)."""
    try:
        return usage_fields(answer_usage(raw))
    except AttemptFailed:
        return None


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps({**ANSWER, "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        json.dumps(
            {
                "usage": {
                    "prompt_tokens": 9,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 4},
                },
                **ANSWER,
            }
        ),
        json.dumps({**ANSWER, "usage": {"prompt_tokens": -5, "completion_tokens": None}}),
        json.dumps({**ANSWER, "usage": None}),
        json.dumps({**ANSWER, "usage": "lots"}),
        json.dumps(ANSWER),
        '{"usage": {"prompt_tokens": 1}, "usage": {"prompt_tokens": 2}}',
        json.dumps([{"usage": {"prompt_tokens": 1}}]),
        '"usage"',
        '{"usage": {"prompt_tokens": 1}',
        "",
    ],
)
def test_the_same_usage_as_a_full_decode(raw: str) -> None:
    """Whatever the body, the usage-only read agrees with decoding the whole answer."""
    try:
        full: Any = msgspec.json.decode(raw.encode())
    except msgspec.DecodeError:
        expected = None
    else:
        expected = usage_from(full)
    assert usage_of_answer(raw.encode()) == expected


def test_counts_are_read() -> None:
    """A typical vLLM answer: prompt, completion and cached tokens."""
    raw = json.dumps(
        {
            **ANSWER,
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 5,
                "total_tokens": 17,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        }
    ).encode()
    assert usage_of_answer(raw) == Usage(12, 5, 8)


@pytest.mark.parametrize(
    "usage",
    [
        '{"prompt_tokens": "many", "completion_tokens": 2}',
        '{"prompt_tokens": -0.5, "completion_tokens": 2.9}',
        '{"prompt_tokens": [1], "completion_tokens": {"a": 1}}',
        '{"prompt_tokens": true, "completion_tokens": 2, "prompt_tokens_details": 7}',
    ],
)
def test_counts_that_are_not_numbers_count_as_zero(usage: str) -> None:
    """An unfamiliar backend's odd counts never raise: what is not a count is 0."""
    raw = ('{"choices": [], "usage": ' + usage + "}").encode()
    got = usage_of_answer(raw)
    assert got is not None
    assert got.prompt_tokens == 0
    assert got.completion_tokens in (0, 2)
    assert usage_from(msgspec.json.decode(raw)) == got


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        ('"300"', 300),
        ('"0"', 0),
        ('"0012"', 12),
        ('"3_00"', 0),  # int() would read 300; not a plain count
        ('"+3"', 0),
        ('" 3"', 0),
        ('"\u0663"', 0),  # an Arabic-Indic digit: isdigit() but not ASCII
        ('"' + "9" * 14 + '"', 0),  # too many digits to be a count
        ("1e26", 1 << 40),  # clipped: it would overflow the limit counters
        (str(10**30), 1 << 40),
        ("1099511627776.5", 1 << 40),
    ],
)
def test_counts_as_digit_strings_are_read_and_huge_counts_clipped(
    count: str, expected: int
) -> None:
    """Some backends send counts as strings of digits; those are counts. Anything else that
    is a string is not, and no count exceeds MAX_COUNT."""
    raw = ('{"choices": [], "usage": {"prompt_tokens": ' + count + "}}").encode()
    got = usage_of_answer(raw)
    assert got is not None
    assert got.prompt_tokens == expected
    assert usage_from(msgspec.json.decode(raw)) == got


async def test_an_answer_with_odd_usage_is_relayed_not_a_500() -> None:
    """Through the whole app: the caller gets the backend's answer as it is."""
    body = (
        b'{"id": "x", "choices": [], "usage": {"prompt_tokens": "many", "completion_tokens": [2]}}'
    )

    class Backend(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # the stdlib's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return

    # In a thread: the test client blocks this loop while the app answers on its own.
    server = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    settings = Settings(
        tiers={
            "fast": TierSettings(model="m", replicas=[url], default_max_tokens=8),
            "precise": TierSettings(model="p", replicas=["http://127.0.0.1:9"]),
        },
        auth=AuthSettings(enabled=False),
    )
    try:
        async with AsyncTestClient(app=create_app(settings)) as client:
            resp = await client.post(
                "/v1/chat/completions",
                json={"model": "fast", "messages": [{"role": "user", "content": "hi"}]},
            )
        assert resp.status_code == 200, resp.text
        assert resp.content == body
    finally:
        server.shutdown()
        server.server_close()


def _opened(answer: dict[str, Any]) -> Opened:
    body = json.dumps(answer).encode()
    return Opened(200, "application/json", body, None, answer_usage(body))


def test_a_completion_reported_as_none_counts_the_answers_text() -> None:
    """``completion_tokens`` 0 beside two choices of 40 characters: about four characters a
    token (10 each), within what the request was allowed; a count above 0 stands as sent."""
    choice = {"index": 0, "message": {"role": "assistant", "content": "x" * 40}}
    usage = {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}
    answer = {**ANSWER, "choices": [choice, {**choice, "index": 1}], "usage": usage}
    assert whole_usage(_opened(answer), 100) == Usage(3, 20)
    assert whole_usage(_opened(answer), 15) == Usage(3, 15)
    assert whole_usage(_opened({**answer, "usage": {**usage, "completion_tokens": 1}}), 100) == (
        Usage(3, 1)
    )


def test_an_echoed_prompt_with_nothing_generated_is_no_completion() -> None:
    """``echo`` with ``max_tokens: 0`` (prompt scoring): the text is the prompt, 0 generated;
    nothing was allowed, so the text is not counted (nor clipped as a claim)."""
    answer = {
        "object": "text_completion",
        "choices": [{"index": 0, "text": "the prompt, echoed", "logprobs": None}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5},
    }
    assert whole_usage(_opened(answer), 0) == Usage(5, 0)
