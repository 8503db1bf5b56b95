"""Attacks on the gateway with backends that frame, end or answer unusually.

A real backend process (``tests.adversarial.sse_upstream``) writes each scripted answer on the
raw socket; a real gateway process relays it; the official ``openai`` client (or httpx, where
the bytes matter) reads it; the gateway's access line says how the request was counted. An
answer the backend finished reaches the caller whole and counts as complete; any other is an
error for the caller and is not counted as complete.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.processes import free_port, http_answers, terminate, wait_ready

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

TIMEOUTS = {"connect_s": 1.0, "first_byte_s": 1.0, "idle_s": 1.0, "total_s": 3.0}


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    """A gateway whose two tiers (vLLM kind) both point at one scripted backend process."""
    port = free_port()
    command = [sys.executable, "-m", "tests.adversarial.sse_upstream", "--port", str(port)]
    backend = subprocess.Popen(command, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(backend, lambda: http_answers(url + "/health"), timeout=10, poll_s=0.05,
                   what="scripted backend", log=lambda: "")  # fmt: skip
        tier = {"replicas": [url], "kind": "vllm", "timeouts": TIMEOUTS}
        config = {
            "auth": {"enabled": False},
            "tiers": {"fast": {"model": "m", **tier}, "precise": {"model": "m2", **tier}},
        }
        with GatewayProcess(config) as gw:
            gw.wait_until_ready(timeout=20)
            yield gw
    finally:
        terminate(backend)


def _body(scenario: str, *, stream: bool) -> dict[str, Any]:
    return {
        "model": "fast",
        "messages": [{"role": "user", "content": scenario}],
        "stream": stream,
        "max_tokens": 10,
    }


def _post(gw: GatewayProcess, scenario: str, *, stream: bool) -> tuple[httpx.Response, str]:
    """The gateway's whole answer to ``scenario``, and the request id it was sent with."""
    request_id = f"sse-{scenario}-{time.monotonic_ns()}"
    answer = httpx.post(
        gw.url + "/v1/chat/completions",
        json=_body(scenario, stream=stream),
        headers={"x-request-id": request_id},
        timeout=15,
    )
    return answer, request_id


def _client(gw: GatewayProcess, request_id: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gw.url + "/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"x-request-id": request_id},
    )


def _streamed(gw: GatewayProcess, scenario: str) -> tuple[str, str | None, int | None, str]:
    """Through the openai client: the text, the finish reason, the completion tokens of the
    usage chunk, and the request id."""
    request_id = f"sse-{scenario}-{time.monotonic_ns()}"
    text, finish, completion = [], None, None
    for chunk in _client(gw, request_id).chat.completions.create(
        model="fast",
        messages=[{"role": "user", "content": scenario}],
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            completion = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish, completion, request_id


@pytest.mark.parametrize(
    ("scenario", "text"),
    [
        ("lf_bytewise", "abc"),  # one byte per TCP write
        ("crlf_bytewise", "abc"),  # CRLF split at every byte, CR and LF in separate reads
        ("bom_lone_cr", "abc"),
        ("multiline", "y"),  # a chunk, and the final chunk, over two data lines each
        ("fields", "x"),  # retry:/id:/event: fields, comments, empty data: lines
        ("huge", "z" * 1_000_000),  # one event just under the 1 MiB limit
        ("until_close", "abc"),  # no length, not chunked: the body ends at the close
        ("spaced_data", "ab"),  # ``data:  {``: two spaces, the same JSON
    ],
)
def test_an_unusually_framed_whole_answer_arrives_whole(
    gateway: GatewayProcess, scenario: str, text: str
) -> None:
    """Each framing the SSE format allows reaches the openai client whole and counts as
    complete, the backend's usage kept."""
    got, finish, completion, request_id = _streamed(gateway, scenario)
    assert (got, finish, completion) == (text, "stop", 3)
    access = gateway.access_of(request_id)
    assert (access["status"], access["outcome"], access["stream_cut"]) == (200, "complete", None)


@pytest.mark.parametrize(
    ("scenario", "cut"),
    [("until_close_cut", "early_eof"), ("error_after_finish", "upstream_error")],
)
def test_a_stream_that_ends_badly_is_an_error_for_the_client(
    gateway: GatewayProcess, scenario: str, cut: str
) -> None:
    """A body ended by the close before any final chunk, and an error event after the final
    chunk: the client raises, and neither counts as complete."""
    answer, request_id = _post(gateway, scenario, stream=True)
    assert b"data: [DONE]" not in answer.content
    with pytest.raises(openai.APIError):
        _streamed(gateway, scenario)
    access = gateway.access_of(request_id)
    assert (access["outcome"] != "complete", access["stream_cut"]) == (True, cut)


def test_a_keep_alive_comment_before_a_first_error_event_is_the_backends_error(
    gateway: GatewayProcess,
) -> None:
    """``: ping`` then the backend's 503 event: the caller gets the 503 as an HTTP error (it
    used to get a 200 stream whose only event was the error, never retried elsewhere)."""
    answer, request_id = _post(gateway, "comment_then_error", stream=True)
    assert answer.status_code == 503, answer.content
    assert gateway.access_of(request_id)["status"] == 503


def test_a_keep_alive_comment_then_silence_is_a_first_byte_timeout(
    gateway: GatewayProcess,
) -> None:
    """``: ping`` then nothing: the first-byte limit applies to the first event (it used to be
    met by the comment, the caller getting a 200 stream that the idle limit later cut)."""
    answer, request_id = _post(gateway, "ping_then_stall", stream=True)
    assert answer.status_code == 504, answer.content
    assert answer.json()["error"]["code"] == "upstream_timeout"
    assert gateway.access_of(request_id)["status"] == 504


@pytest.mark.parametrize(
    ("scenario", "status", "message"),
    [("ok_with_error", 502, "model crashed"), ("ok_with_flat_400", 400, "bad prompt")],
)
def test_a_200_whose_body_is_an_error_object_is_an_error(
    gateway: GatewayProcess, scenario: str, status: int, message: str
) -> None:
    """A 200 carrying ``{"error": {...}}`` (or the flat error shape) and no answer is the error
    its code names: it used to reach the openai client as a ChatCompletion with no choices and
    count as complete."""
    answer, request_id = _post(gateway, scenario, stream=False)
    assert answer.status_code == status, answer.content
    assert message in answer.json()["error"]["message"]
    access = gateway.access_of(request_id)
    assert (access["status"], access["outcome"] != "complete") == (status, True)


@pytest.mark.parametrize(
    ("scenario", "code"),
    [("gzipped", "bad_upstream_answer"), ("reset_after_json", "upstream_unavailable")],
)
def test_an_answer_that_cannot_be_read_as_sent_is_never_a_200(
    gateway: GatewayProcess, scenario: str, code: str
) -> None:
    """A gzip body the gateway never asked for (it is never passed on as garbage), and a body
    ended by the close whose connection was reset after the JSON: a 502."""
    answer, _ = _post(gateway, scenario, stream=False)
    assert answer.status_code == 502, answer.content
    assert answer.json()["error"]["code"] == code


@pytest.mark.parametrize("scenario", ["garbage", "bare_text"])
def test_an_event_that_is_not_json_ends_the_stream_as_an_error(
    gateway: GatewayProcess, scenario: str
) -> None:
    """``data: {not json`` or plain text mid-stream: the openai client used to fail on it with
    a JSON error while the gateway counted the stream complete. The event is not passed on:
    the stream ends there with an error event the client raises as ``APIError``."""
    answer, request_id = _post(gateway, scenario, stream=True)
    assert b"not json" not in answer.content
    assert b"try later" not in answer.content
    assert b"data: [DONE]" not in answer.content
    assert b"not JSON" in answer.content  # the error event's message
    access = gateway.access_of(request_id)
    assert (access["outcome"], access["stream_cut"]) == ("upstream_error", "malformed_event")
    with pytest.raises(openai.APIError, match="not JSON"):
        _streamed(gateway, scenario)


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ("flat_error_midstream", "KV cache full"),
        ("spaced_error_midstream", "engine died"),
        ("huge_number_error_midstream", "engine overflow"),  # 1e400: the strict decoder refuses
    ],
)
def test_an_error_event_in_another_shape_is_the_backends_error(
    gateway: GatewayProcess, scenario: str, message: str
) -> None:
    """The flat error shape (SGLang, older vLLM) or ``{ "error"`` with a space, mid-stream:
    the client raises the backend's message (the flat one used to reach it as a chunk with no
    choices), and the cause is the backend's error, not ``no_finish_reason``."""
    answer, request_id = _post(gateway, scenario, stream=True)
    assert b"data: [DONE]" not in answer.content
    access = gateway.access_of(request_id)
    assert (access["outcome"], access["stream_cut"]) == ("upstream_error", "upstream_error")
    with pytest.raises(openai.APIError, match=message):
        _streamed(gateway, scenario)


def test_a_first_event_in_the_flat_error_shape_is_an_http_error(gateway: GatewayProcess) -> None:
    """A stream whose first event is a flat error with code 400: the caller gets a 400, as for
    ``{"error": {...}}`` (it used to get a 200 stream)."""
    answer, request_id = _post(gateway, "flat_error_first", stream=True)
    assert answer.status_code == 400, answer.content
    assert "prompt too long" in answer.json()["error"]["message"]
    assert gateway.access_of(request_id)["status"] == 400


def test_a_chunk_whose_token_is_the_word_error_is_a_chunk(gateway: GatewayProcess) -> None:
    """A token spelled ``"error"`` is text, not an error event."""
    got, finish, completion, request_id = _streamed(gateway, "the_word_error")
    assert (got, finish, completion) == ("error", "stop", 3)
    assert gateway.access_of(request_id)["outcome"] == "complete"


def test_keep_alive_comments_alone_do_not_keep_a_stalled_stream_open(
    gateway: GatewayProcess,
) -> None:
    """One token, then comments only: cut as a stall after ``idle_s``, not at the deadline."""
    started = time.monotonic()
    answer, request_id = _post(gateway, "pings_forever", stream=True)
    assert b"data: [DONE]" not in answer.content
    assert gateway.access_of(request_id)["stream_cut"] == "stall"
    assert time.monotonic() - started < TIMEOUTS["total_s"]
