"""Attacks on the changes since 85e32ba: the relay's JSON check and error events, the upstream
key blanked in error events, the usage store's refused increments, the structured-output rule
in engine fields, and the linear-time LaTeX scan.

Where a gateway is involved it is a real process, in front of a scripted backend process
(``tests.adversarial.sse_upstream``, ``tests.adversarial.key_echo_upstream``), read with the
official ``openai`` client or httpx where the bytes matter. The relay's own checks run both
ways a stream reaches a client (``tests.gateway.relay_drive.DRIVES``).

Findings (each a test that failed on the code it attacked):

- T1: an event whose data holds bytes that are not UTF-8 passed the JSON check (msgspec's
  ``Raw`` skips strings unread), reached the caller, whose openai client failed on it with a
  ``UnicodeDecodeError``, and the stream counted complete; an error event holding such a byte
  after the final chunk was relayed as a chunk and the stream counted complete too.
- T2: an in-band error event that quotes the upstream key in its ``type`` was rewritten with
  the key blanked in the message only: the ``type`` went out with the key.
- T3: an in-band error event that quotes the key with JSON escapes (``\\/`` for ``/``, as PHP's
  json_encode writes it) was not seen to quote it and went out as sent: the caller's JSON
  decoder reads the key.
- T4: a backend error message is cut at 2,000 characters before the key is blanked: a key that
  the cut splits is not found, and its start goes out (a caller whose prompt the backend echoes
  before the key chooses the cut, so all but the key's last character).
- T5: a JSON schema under ``response_format`` in TGI's (``{"type": "json", "value": ...}``) or
  llama.cpp's (``{"type": "json_object", "schema": ...}``) spelling escapes the
  structured-output rule.

Held (tests below): valid JSON naming ``error`` (a token, ``"error": null`` next to choices),
a CR at a data line's end, a 400-digit number and nesting of 900 levels pass both relay paths;
an HTTP error answer decodes before it blanks (escaped key, key in ``type``); a schema in an
engine field and nothing else meets the rule; the LaTeX scan drops what the regex dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.pipeline.events import Outcome
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.keys import blank
from gateway.upstream.sse import quoted_keys
from policies.requests import validate
from router_models.packaging import _drop_latex
from tests.adversarial.sse_upstream import DONE, ROLE, USAGE, final, token
from tests.gateway.raw_upstream import Respond
from tests.gateway.relay_drive import DRIVES, drive, open_relay
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.processes import free_port, http_answers, terminate, wait_ready

pytestmark = pytest.mark.slow  # an attack suite: make test-all and CI
TIMEOUTS = {"connect_s": 1.0, "first_byte_s": 1.0, "idle_s": 1.0, "total_s": 3.0}
# An upstream key with a "/" (base64 keys have them): PHP's json_encode writes it "\/".
UPSTREAM_KEY = "sk-today/upstream+key=0123456789abcdefXYZ"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@contextlib.contextmanager
def _backend(module: str, *args: str) -> Iterator[str]:
    """A scripted backend process (``python -m <module> --port N ARGS``); its base URL."""
    port = free_port()
    command = [sys.executable, "-m", module, "--port", str(port), *args]
    backend = subprocess.Popen(command, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(backend, lambda: http_answers(url + "/health"), timeout=10, poll_s=0.05,
                   what=module, log=lambda: "")  # fmt: skip
        yield url
    finally:
        terminate(backend)


def _config(url: str, **tier: Any) -> dict[str, Any]:
    tier = {"replicas": [url], "kind": "vllm", "timeouts": TIMEOUTS, **tier}
    return {
        "auth": {"enabled": False},
        "tiers": {"fast": {"model": "m", **tier}, "precise": {"model": "m2", **tier}},
    }


# T1 -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted() -> Iterator[GatewayProcess]:
    """A gateway whose two tiers point at one scripted backend process."""
    with _backend("tests.adversarial.sse_upstream") as url, GatewayProcess(_config(url)) as gw:
        gw.wait_until_ready(timeout=20)
        yield gw


def _openai_stream(gw: GatewayProcess, scenario: str, request_id: str) -> str:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0,
                           default_headers={"x-request-id": request_id})  # fmt: skip
    text: list[str] = []
    for chunk in client.chat.completions.create(
        model="fast", messages=[{"role": "user", "content": scenario}], stream=True
    ):
        text.extend(choice.delta.content or "" for choice in chunk.choices)
    return "".join(text)


@pytest.mark.parametrize("scenario", ["bad_utf8_token", "bad_utf8_error_after_finish"])
def test_an_event_that_is_not_utf8_ends_the_stream_as_an_error(
    scripted: GatewayProcess, scenario: str
) -> None:
    """T1. A chunk, or an error event after the final chunk, holding a byte that is not UTF-8:
    the openai client used to fail with a UnicodeDecodeError while the gateway counted the
    stream complete. The event is not passed on; the stream ends there with the error event
    the client raises as APIError, and it is not counted complete."""
    request_id = f"today-{scenario}-{time.monotonic_ns()}"
    answer = httpx.post(
        scripted.url + "/v1/chat/completions",
        json={
            "model": "fast",
            "messages": [{"role": "user", "content": scenario}],
            "stream": True,
        },
        headers={"x-request-id": request_id},
        timeout=15,
    )
    assert b"\xff" not in answer.content
    assert b"data: [DONE]" not in answer.content
    access = scripted.access_of(request_id)
    assert access["outcome"] != "complete", access
    with pytest.raises(openai.APIError):
        _openai_stream(scripted, scenario, f"{request_id}-sdk")


def _respond(*events: bytes) -> Respond:
    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD)
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\n\r\n")
        return True

    return respond


_NOT_UTF8 = token("b?").replace(b"b?", b"b\xff")


@pytest.mark.parametrize("how", DRIVES)
@pytest.mark.parametrize(
    ("events", "cut"),
    [
        ((ROLE, token(), _NOT_UTF8, final(), USAGE, DONE), "malformed_event"),
        ((ROLE, final(), b'data: {"error":{"message":"x \xff"}}\n\n'), "malformed_event"),
        # Held: what an SSE client reads is JSON, both ways.
        ((ROLE, token("error"), final(), USAGE, DONE), None),  # the word
        ((ROLE, token()[:-2] + b"\r\n\n", final(), USAGE, DONE), None),  # a CR at the end
        (
            (
                ROLE,
                b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],'
                b'"error":null}\n\n',
                final(),
                USAGE,
                DONE,
            ),
            None,
        ),
        ((ROLE, b'data: {"x":' + b"9" * 400 + b"}\n\n", final(), DONE), None),  # a huge number
        ((ROLE, b'data: {"x":' + b"[" * 900 + b"]" * 900 + b"}\n\n", final(), DONE), None),
    ],
)
async def test_the_json_check_is_the_same_both_ways(
    upstream: UpstreamClient, events: tuple[bytes, ...], cut: str | None, how: str
) -> None:
    """T1 at the relay, both ways a stream reaches a client: data that is not UTF-8 ends the
    stream as a malformed event (it used to go out, the stream complete); valid JSON that
    names ``error`` (a token, a null field next to ``choices``), a CR at a line's end, a
    400-digit number and nesting of 900 levels go out whole."""
    relay, _pool, server = await open_relay(upstream, _respond(*events))
    try:
        text = await drive(relay, how)
    finally:
        await server.stop()
    assert relay.cut == cut, text
    assert (relay.outcome == Outcome.COMPLETE) == (cut is None)
    assert b"\xff" not in text


# T2, T3, T4 -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _key_echo(status: int, shape: str) -> Iterator[GatewayProcess]:
    """A gateway in front of a backend that quotes the upstream key it gets (``shape``)."""
    args = ("--status", str(status), "--shape", shape)
    with (
        _backend("tests.adversarial.key_echo_upstream", *args) as url,
        GatewayProcess(_config(url, api_key=UPSTREAM_KEY)) as gw,
    ):
        gw.wait_until_ready(timeout=20)
        yield gw


def _key_parts(text: str) -> list[str]:
    """The pieces of the upstream key, of 12 characters or more, that ``text`` shows (its
    JSON escapes read)."""
    text = text.replace("\\/", "/")
    return [UPSTREAM_KEY[:n] for n in range(12, len(UPSTREAM_KEY) + 1) if UPSTREAM_KEY[:n] in text]


# The request's message, sized so that the backend's message (it, a space, the key) is cut at
# 2,000 characters with 30 of the key's characters before the cut.
_LONG = "a" * (2000 - 1 - 30)


@pytest.mark.parametrize(
    ("shape", "content"),
    [("type", "hi"), ("escaped", "hi"), ("long", _LONG)],
)
def test_an_error_event_never_shows_the_upstream_key(shape: str, content: str) -> None:
    """T2-T4. A 200 stream whose in-band error event quotes the upstream key in its ``type``,
    with JSON escapes, or after a caller-sized text that the 2,000-character cut splits the
    key at: the caller's stream ends with the backend's error and shows no part of the key."""
    chat = {"model": "fast", "messages": [{"role": "user", "content": content}], "stream": True}
    with _key_echo(200, shape) as gw:
        answer = httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=10)
        assert answer.status_code == 200
        assert "data: [DONE]" not in answer.text
        assert _key_parts(answer.text) == []
        assert _key_parts(gw.log_text()) == []


@pytest.mark.parametrize("shape", ["long", "escaped", "type"])
def test_an_error_answer_never_shows_the_upstream_key(shape: str) -> None:
    """T4 for an HTTP error answer (400): the message cut at 2,000 characters used to show the
    key's first 30 characters. The escaped and ``type`` forms hold here (the error is decoded
    before it is blanked, and its ``type`` is not passed on)."""
    content = _LONG if shape == "long" else "hi"
    chat = {"model": "fast", "messages": [{"role": "user", "content": content}]}
    with _key_echo(400, shape) as gw:
        answer = httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=10)
        assert answer.status_code == 400
        assert _key_parts(answer.text) == []
        assert _key_parts(gw.log_text()) == []


# T5 -------------------------------------------------------------------------------------------


def _format(body_extra: dict[str, Any]) -> str | None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], **body_extra}
    return validate(body, "chat").response_format


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json", "value": SCHEMA}, {"type": "json_object", "schema": SCHEMA}],
)
def test_a_schema_in_an_engines_response_format_meets_the_structured_output_rule(
    response_format: dict[str, Any],
) -> None:
    """T5. TGI's grammar (``{"type": "json", "value": schema}``) and llama.cpp's
    ``{"type": "json_object", "schema": schema}`` constrain the answer to a JSON schema as
    ``json_schema`` does; they met no rule (``json``) or only the json_object one (off by
    default)."""
    assert _format({"response_format": response_format}) == "json_schema"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema"),
        ({"guided_json": SCHEMA}, "json_schema"),
        ({"json_schema": SCHEMA}, "json_schema"),
        ({"structured_outputs": {"regex": "a+"}}, None),
        ({"structured_outputs": "json"}, None),  # not an object: the engine refuses it
        ({"structured_outputs": None, "guided_json": None}, None),
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"response_format": {"type": "text"}}, "text"),
    ],
)
def test_engine_fields_meet_the_rules_they_should(extra: dict[str, Any], expected: str) -> None:
    """Held: a schema in an engine's own field is ``json_schema``; a regex, a non-object
    ``structured_outputs`` and null fields are not; plain JSON mode stays ``json_object``."""
    assert _format(extra) == expected


def test_every_json_spelling_of_a_key_is_found_and_a_cut_key_is_blanked() -> None:
    """The fix of T3 and T4 at unit level: a key written with ``\\u`` escapes, or one of two
    keys only in a nested field, is found; a text cut in the middle of a key loses its start."""
    key = "sk-abc/def"
    event = b'data: {"error":{"message":"\\u0073k-abc\\/def"}}'
    assert quoted_keys(event, (key,)) == [key]
    nested = b'data: {"error":{"message":"x","param":{"k":["sk-abc\\/def"]}}}'
    assert quoted_keys(nested, ("other", key)) == [key]
    assert quoted_keys(b'data: {"error":{"message":"none"}}', (key,)) == []
    assert blank("Incorrect key: sk-abc/d", (key,)) == "Incorrect key: [REDACTED]"
    assert blank("sk-abc/def and sk-a", (key,)) == "[REDACTED] and [REDACTED]"
    assert blank("ends in sk", (key,)) == "ends in sk"  # under four characters: kept


# Held: the LaTeX scan -------------------------------------------------------------------------

# The regex that ``_drop_latex`` replaced (85e32ba's router_models/packaging.py).
_OLD_LATEX = re.compile(
    r"\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|\\begin\{([a-z*]+)\}.+?\\end\{\1\}"
    r"|\$[^$\n]*\\[a-zA-Z]+[^$\n]*\$",
    re.DOTALL,
)
_ATOMS = ("$", "$$", "\\", "[", "]", "(", ")", "\\[", "\\]", "\\(", "\\)", "\\begin{a}",
          "\\end{a}", "\\begin{a*}", "\\end{a*}", "\\begin{ab}", "\\end{ab}", "\\begin{",
          "\\end{", "}", "{", "a", "*", " ", "\n", "\\frac", "\\F", "\\\\", "é", "\U0001d465",
          "\\begin{A}", "\\end{A}")  # fmt: skip


def test_the_linear_latex_scan_drops_what_the_old_regex_dropped() -> None:
    """30,000 random texts of LaTeX openers and closers (nested, overlapping, ``$$`` inside
    ``\\[``, starred and upper-case environments, unicode): the same output as the regex."""
    rng = random.Random(85)
    for _ in range(30_000):
        text = "".join(rng.choice(_ATOMS) for _ in range(rng.randint(0, 24)))
        assert _drop_latex(text) == _OLD_LATEX.sub(" ", text), text


def test_a_key_inside_another_key_leaves_nothing_of_the_longer_one() -> None:
    """Two tiers' keys, one the start of the other (``sk-team`` and ``sk-team-second``): the
    backend's message naming the longer one is blanked whole, whichever order the keys come in
    (the shorter blanked first left ``[REDACTED]-second``)."""
    short, long = "sk-team-0123456789", "sk-team-0123456789-second-key"
    for keys in ((short, long), (long, short)):
        assert blank(f"Incorrect key: {long}.", keys) == "Incorrect key: [REDACTED]."
        assert blank(f"{short} then {long}", keys) == "[REDACTED] then [REDACTED]"
