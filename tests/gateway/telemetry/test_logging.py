"""Logging: the bounded sink, redaction, JSON/console rendering and stdlib routing."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import msgspec
import pytest
import structlog

from gateway.config.settings import TelemetrySettings
from gateway.telemetry import semconv as sc
from gateway.telemetry.logging import (
    AccessLines,
    LogSink,
    access_logger,
    configure_logging,
    make_redactor,
    scrub,
)
from gateway.telemetry.observer import access_fields
from tests.gateway.telemetry.factories import finished_context


def test_sink_drops_lines_beyond_its_bound_and_says_so() -> None:
    """A full queue drops new lines instead of blocking, then reports how many."""
    out = io.StringIO()
    sink = LogSink(out, max_lines=2, flush_interval_s=3600)
    for i in range(5):
        sink.write(f"line {i}")
    sink.close()
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["line 0", "line 1"]
    assert json.loads(lines[2]) == {
        "event": "telemetry.log_lines_dropped",
        "level": "warning",
        "count": 3,
    }
    assert sink.dropped == 3


def test_sink_writes_in_the_background() -> None:
    """Lines reach the stream from the writer thread without an explicit flush."""
    out = io.StringIO()
    sink = LogSink(out, flush_interval_s=0.01)
    sink.write("hello")
    for _ in range(200):
        if out.getvalue():
            break
        sink._stop.wait(0.01)
    assert out.getvalue() == "hello\n"
    sink.close()


def test_redaction_blanks_secret_fields_and_content() -> None:
    """Secret-named fields and prompt text are replaced; ids stay."""
    redact = make_redactor(capture_content=False)
    event = redact(
        None,
        "info",
        {
            "event": "x",
            "authorization": "Bearer sk-1",
            "api_key": "sk-2",
            "messages": [{"role": "user", "content": "secret prompt"}],
            "key_id": "k_1",
        },
    )
    assert event == {
        "event": "x",
        "authorization": "[REDACTED]",
        "api_key": "[REDACTED]",
        "messages": "[REDACTED]",
        "key_id": "k_1",
    }


def test_rendered_lines_are_scrubbed_of_credentials_and_stay_json() -> None:
    """Bearer tokens and TierGate keys are scrubbed anywhere in a line, keeping it valid."""
    line = json.dumps(
        {
            "event": "upstream said: Bearer abc.def-123 was refused",
            "note": 'auth="basic dXNlcjpwYXNz"',
            "key": None,
            "echo": "got tg-8zgtkq64w6-6t45CZkwdw7LWzrJoxEW4eauAHy7jjs2uAd7YurF7LO, bye",
            "key_id": "8zgtkq64w6",
        }
    )
    record = json.loads(scrub(line))
    assert record["event"] == "upstream said: [REDACTED] was refused"
    assert record["note"] == 'auth="[REDACTED]"'
    assert record["echo"] == "got [REDACTED], bye"
    assert record["key_id"] == "8zgtkq64w6"


def test_redaction_keeps_content_when_capture_is_on() -> None:
    """With content capture opted in, prompts stay; keys are still blanked."""
    redact = make_redactor(capture_content=True)
    event = redact(None, "info", {"event": "x", "prompt": "hello", "token": "t"})
    assert event == {"event": "x", "prompt": "hello", "token": "[REDACTED]"}


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_the_bound_request_context() -> None:
    """Events render as one JSON object per line with the contextvars-bound fields."""
    out = io.StringIO()
    sink = configure_logging(TelemetrySettings(log_format="auto"), stream=out)
    structlog.contextvars.bind_contextvars(request_id="r-1")
    structlog.get_logger("test").info("ratelimit.rejected", key_id="k_1")
    structlog.get_logger("test").debug("not.shown")
    sink.close()
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["event"] == "ratelimit.rejected"
    assert record["request_id"] == "r-1"
    assert record["level"] == "info"
    assert "timestamp" in record


@pytest.mark.usefixtures("restore_logging")
def test_console_rendering_and_level_from_settings() -> None:
    """``console`` renders human-friendly lines; the level setting filters."""
    out = io.StringIO()
    sink = configure_logging(
        TelemetrySettings(log_format="console", log_level="warning"), stream=out
    )
    structlog.get_logger("test").info("hidden.event")
    structlog.get_logger("test").warning("shown.event", replica="r1")
    sink.close()
    text = out.getvalue()
    assert "hidden.event" not in text
    assert "shown.event" in text
    assert "replica=r1" in text
    assert not text.lstrip().startswith("{")


@pytest.mark.usefixtures("restore_logging")
def test_stdlib_records_go_to_the_same_file_and_client_loggers_are_quiet(
    tmp_path: Path,
) -> None:
    """uvicorn's records land in the log file as JSON; HTTP-client INFO records do not."""
    log_file = tmp_path / "logs" / "gateway.log"
    sink = configure_logging(TelemetrySettings(log_file=log_file))
    logging.getLogger("uvicorn.error").warning("server trouble")
    logging.getLogger("aiohttp.client").info("POST http://replica/v1/chat/completions")
    logging.getLogger("httpx").info("HTTP Request: POST ...")
    sink.close()
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [r["event"] for r in records] == ["server trouble"]
    assert records[0]["level"] == "warning"


def _rendered_by_both(worker: int | None) -> tuple[dict[str, object], dict[str, object]]:
    """The same access line through structlog's chain and through the direct writer."""
    out = io.StringIO()
    sink = configure_logging(TelemetrySettings(log_format="json"), stream=out, worker=worker)
    fields = access_fields(finished_context(), "complete", 0.25, 0.001)
    structlog.contextvars.bind_contextvars(request_id=fields["request_id"], trace_id=None)
    structlog.get_logger("tiergate.access").bind().info(sc.EVENT_ACCESS, **fields)
    writer = access_logger()
    assert isinstance(writer, AccessLines)
    writer.info(sc.EVENT_ACCESS, **fields)
    sink.close()
    by_chain, direct = (json.loads(line) for line in out.getvalue().splitlines())
    return by_chain, direct


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("worker", [None, 1])
def test_direct_access_lines_match_what_structlog_renders(worker: int | None) -> None:
    """The direct JSON writer gives the chain's line: same keys in the same order, same values
    (the timestamps differ by the time between the two calls)."""
    by_chain, direct = _rendered_by_both(worker)
    assert list(by_chain) == list(direct)
    assert by_chain.pop("timestamp") <= direct.pop("timestamp")  # type: ignore[operator]
    assert by_chain == direct
    assert direct["level"] == "info"
    assert direct.get("worker") == worker


@pytest.mark.usefixtures("restore_logging")
def test_access_lines_use_structlog_when_not_json_or_above_info() -> None:
    """Console rendering and a level above info keep structlog's logger (which filters); a
    closed sink takes its direct writer with it."""
    for telemetry in (
        TelemetrySettings(log_format="console"),
        TelemetrySettings(log_format="json", log_level="warning"),
    ):
        sink = configure_logging(telemetry, stream=io.StringIO())
        assert not isinstance(access_logger(), AccessLines)
        sink.close()
    sink = configure_logging(TelemetrySettings(log_format="json"), stream=io.StringIO())
    assert isinstance(access_logger(), AccessLines)
    sink.close()
    assert not isinstance(access_logger(), AccessLines)


def test_access_fields_need_no_redaction_by_name() -> None:
    """The direct writer skips the name-based redactor: no access field may be one it blanks."""
    fields = access_fields(finished_context(), "complete", 0.25, 0.001)
    redact = make_redactor(capture_content=False)
    assert redact(None, "info", dict(fields)) == fields


@pytest.mark.usefixtures("restore_logging")
def test_direct_access_lines_are_scrubbed() -> None:
    """A credential in a caller-chosen value (the model name) is scrubbed on the direct path."""
    out = io.StringIO()
    sink = configure_logging(TelemetrySettings(log_format="json"), stream=out)
    access_logger().info(sc.EVENT_ACCESS, model="Bearer sk-live-123456", status=200)
    sink.close()
    (line,) = out.getvalue().splitlines()
    assert "sk-live" not in line
    assert json.loads(line)["model"] == "[REDACTED]"


@pytest.mark.parametrize(
    "value",
    [
        "Bearer\tsk-live-1234567890",
        "Bearer\u000bsk-live-1234567890",
        "basic\r\ndXNlcjpwYXNzd29yZA==",
        "Xtg-k1abc-6t45CZkwdw7LWzrJoxEW4e",
        "_tg-k1abc-6t45CZkwdw7LWzrJoxEW4e",
    ],
)
def test_credentials_split_by_json_escapes_or_glued_to_a_word_are_scrubbed(value: str) -> None:
    """A caller-chosen value (the model name) rendered by the JSON encoder: a tab or a control
    character between scheme and token becomes an escape, not whitespace; a key may follow a
    letter. Neither gets past the scrubber, and the line stays JSON."""
    line = msgspec.json.encode({"model": value}).decode()
    scrubbed = scrub(line)
    assert "sk-live" not in scrubbed
    assert "dXNlcjpwYXNz" not in scrubbed
    assert "6t45CZkwdw7" not in scrubbed
    assert "[REDACTED]" in json.loads(scrubbed)["model"]


@pytest.mark.parametrize(
    ("line", "kept", "gone"),
    [
        ("url: /v1/traces?api-key=K1x&tenant=t1", "tenant=t1", "K1x"),
        ("GET /p?status_code=200&x_token=T2x", "status_code=200", "T2x"),
        ("blob?sv=1;sig=S3x&access_token=A4x", "sv=1", "S3x"),
        ('{"url":"rediss://user:P5x@host:6380/0"}', "user:", "P5x"),
        ("model=fast key_id=abc token_count=3 keyboard=1", "token_count=3 keyboard=1", "\0"),
    ],
)
def test_secrets_inside_urls_are_scrubbed_and_nothing_else(line: str, kept: str, gone: str) -> None:
    """A URL's password and credential-named query parameters go; other ``name=value``
    pairs (console lines, ordinary query parameters) stay."""
    out = scrub(line)
    assert kept in out
    assert gone not in out
    if gone != "\0":
        assert "[REDACTED]" in out
