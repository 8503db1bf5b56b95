"""structlog, configured once per process: JSON or console lines through one bounded queue.

Every line (structlog events and the standard library's ``uvicorn``/``litestar``/
``opentelemetry`` records alike) is rendered on the calling thread and appended to a bounded
in-memory queue; a daemon thread writes the queue out in batches. The request path therefore
never waits on a slow disk or a full pipe: when the queue is full, lines are dropped and
counted, and a ``telemetry.log_lines_dropped`` line says how many.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import msgspec
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from gateway.config.settings import TelemetrySettings
from gateway.telemetry import semconv as sc

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# Client libraries that would otherwise log every upstream call.
_QUIET_LOGGERS = ("aiohttp", "httpx", "httpcore", "uvicorn.access", "urllib3", "hpack", "grpc")
_REDACTED = "[REDACTED]"
_SECRET_KEYS = frozenset(
    {
        "authorization",
        "api_key",
        "apikey",
        "key",
        "token",
        "admin_token",
        "password",
        "secret",
        "cookie",
        "x-api-key",
        "headers",
    }
)
_CONTENT_KEYS = frozenset({"prompt", "messages", "content", "completion", "input", "output"})
# Credentials in any value: "Bearer <token>", "Basic <token>", TierGate keys (tg-<id>-<secret>).
# Token characters stop at quotes, backslashes and commas, so a scrubbed JSON line stays valid.
# Between the scheme and the token: whitespace, or whitespace as JSON writes it in a rendered
# line (``\t``, ``\u000b``...). A TierGate key is matched wherever it starts, even glued to
# a word: a few redacted words cost less than one key in a log.
_SECRET_VALUE = re.compile(
    r"(?:[Bb](?:earer|asic)|BEARER|BASIC)(?:\s|\\[tnrfb]|\\u00[0-9a-fA-F]{2})+[^\s\"'\\,]+"
    r"|tg-[a-z0-9]+-[A-Za-z0-9_\-]{16,}"
)
# Credentials inside URLs, wherever a line quotes one (an exporter's or client library's
# error names the URL it failed on): the password of a URL's user-info, and the value of a
# query parameter named like a credential. Only the secret is replaced, so the line still
# says where the request went.
_URL_SECRET = re.compile(
    r"(?<=://)([^\s/@:\"'\\]*:)[^\s/@\"'\\]+(?=@)"
    r"|(?<=[?&;])((?:[\w.-]*[-_.])?(?:api[-_.]?key|apikey|key|token|access[-_.]?token|"
    r"auth|authorization|password|passwd|pwd|secret|sig|signature|credential)=)"
    r"[^\s&;#\"'\\]+",
    re.IGNORECASE,
)
_encoder = msgspec.json.Encoder(enc_hook=str)
# What JSON leaves raw but a reader may take for a line break (``str.splitlines``, viewers,
# shippers: U+0085, U+2028, U+2029) or a terminal for a control (DEL, the C1 controls):
# escaped in every JSON line, so one value never splits or steers its line.
_JSON_RAW_CONTROLS = str.maketrans(
    {c: f"\\u{ord(c):04x}" for c in ["\x7f", *map(chr, range(0x80, 0xA0)), "\u2028", "\u2029"]}
)


# How long the last lines may take to be written when the process ends.
FLUSH_TIMEOUT_S = 2.0


def open_log_file(path: Path) -> TextIO:
    """``path`` opened for appending, as every log file is."""
    return path.open("a", encoding="utf-8", buffering=1 << 16)


class LogSink:
    """A bounded queue of rendered lines and the daemon thread that writes them."""

    def __init__(
        self,
        stream: TextIO,
        *,
        owns_stream: bool = False,
        max_lines: int = 20_000,
        flush_interval_s: float = 0.05,
        path: Path | None = None,
    ) -> None:
        self.stream = stream
        self.owns_stream = owns_stream
        self.path = path  # the file ``stream`` was opened from: reopened when moved away
        self.max_lines = max_lines
        self.flush_interval_s = flush_interval_s
        self.dropped = 0
        self._reported = 0
        self._lines: deque[str] = deque()
        self._writing = threading.Lock()  # the writer thread and ``flush`` take turns
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tiergate-log-writer", daemon=True)
        self._thread.start()

    def write(self, line: str) -> None:
        """Queue one rendered line (never blocks; drops when the queue is full)."""
        if len(self._lines) >= self.max_lines:
            self.dropped += 1
            return
        self._lines.append(line)

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Write what is queued now, before the process may end, waiting at most
        ``timeout_s``: a write that never returns (the output is a full pipe nobody reads)
        holds the writer's lock, and the process must still end. The write is made on a
        helper daemon thread, which ends with the process when it cannot finish."""
        helper = threading.Thread(target=self._drain, name="tiergate-log-flush", daemon=True)
        helper.start()
        helper.join(timeout_s)
        return not helper.is_alive()

    def _drain(self) -> None:
        with self._writing:
            self._drain_locked()

    def _drain_locked(self) -> None:
        lines = self._lines
        batch: list[str] = []
        while lines:
            batch.append(lines.popleft())
        if self.dropped != self._reported:
            missed = self.dropped - self._reported
            self._reported = self.dropped
            batch.append(
                _encoder.encode(
                    {"event": sc.EVENT_LOGS_DROPPED, "level": "warning", "count": missed}
                ).decode()
            )
        if batch:
            self.stream.write("\n".join(batch) + "\n")
            self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            if self.path is not None and self._lines:  # a stat and an fstat, before each write
                self._reopen_if_moved(self.path)
            self._drain()

    def _reopen_if_moved(self, path: Path) -> None:
        """Open a new file at ``path`` when the one written to is no longer there (renamed
        or deleted by a log rotation); lines went on into the moved file before."""
        try:
            here = os.stat(path)
        except FileNotFoundError:
            here = None
        except OSError:
            return  # the directory cannot be read now: keep writing where we are
        current = os.fstat(self.stream.fileno())
        if here is not None and (here.st_ino, here.st_dev) == (current.st_ino, current.st_dev):
            return
        try:
            fresh = open_log_file(path)
        except OSError:
            return  # cannot create it (permissions, a full disk): keep the old file
        with self._writing:
            old, self.stream = self.stream, fresh
        old.close()

    def close(self) -> None:
        """Write what is queued and stop the writer thread."""
        global _access_lines  # noqa: PLW0603  # the writer into this sink goes with it
        if _access_lines is not None and _access_lines.sink is self:
            _access_lines = None
        self._stop.set()
        self._thread.join(timeout=5)
        if self.flush() and self.owns_stream:  # a write still blocked would block the close
            self.stream.close()


class _SinkLogger:
    """The structlog "wrapped logger": hands the rendered line to the sink."""

    def __init__(self, sink: LogSink) -> None:
        self._write = sink.write

    def msg(self, message: str) -> None:
        """Every level ends here."""
        self._write(message)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


class _SinkHandler(logging.Handler):
    """Standard-library records, rendered by structlog's formatter, into the same sink."""

    def __init__(self, sink: LogSink) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        """Format and queue one record."""
        try:
            self.sink.write(self.format(record))
        except Exception:  # noqa: BLE001  # logging must never raise into the caller
            self.handleError(record)


def make_redactor(capture_content: bool) -> Processor:
    """A processor that blanks secret-named fields (and prompt/completion text unless capture
    is on). Secret-looking values anywhere in a line are scrubbed after rendering (``scrub``)."""
    keys = _SECRET_KEYS if capture_content else _SECRET_KEYS | _CONTENT_KEYS

    def redact(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        for key in keys.intersection(event_dict):
            event_dict[key] = _REDACTED
        return event_dict

    return redact


_known_secrets: list[str] = []


def register_secret(value: str | None) -> None:
    """Scrub ``value`` (the admin token) by value from every line from now on, wherever a
    caller put it (a ``model``, a header echoed in an error)."""
    if value and value not in _known_secrets:
        _known_secrets.append(value)


def scrub(line: str) -> str:
    """Replace bearer/basic credentials, TierGate API keys and registered secrets wherever they
    appear in a line."""
    for secret in _known_secrets:
        if secret in line:
            line = line.replace(secret, _REDACTED)
    # Substring checks first: the regex is ~10x slower and almost every line has no secret.
    if "earer" in line or "asic" in line or "tg-" in line or "EARER" in line or "ASIC" in line:
        line = _SECRET_VALUE.sub(_REDACTED, line)
    if "=" in line or ("@" in line and "://" in line):
        line = _URL_SECRET.sub(_url_redacted, line)
    return line


def _url_redacted(match: re.Match[str]) -> str:
    """The name a URL's secret goes by (``user:``, ``api-key=``), its value redacted."""
    return f"{match.group(1) or match.group(2)}{_REDACTED}"


def one_line(line: str) -> str:
    """A rendered JSON line with the characters JSON leaves raw that split or steer a line
    escaped (two scans of C speed when there are none, as on almost every line)."""
    if line.isascii() and "\x7f" not in line:
        return line
    return line.translate(_JSON_RAW_CONTROLS)


def _escape(value: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def _printable(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Console lines: a string value with any character that is not printable (terminal
    escapes, line breaks, Unicode separators) is shown escaped, as ``repr`` would show it.
    The console renderer quotes only values with spaces, quotes, ``=`` or CR/LF, and writes
    the rest raw: ``ESC[1A ESC[2K`` from a caller would rewrite the operator's screen."""
    for key, value in event_dict.items():
        if type(value) is str and not value.isprintable() and key not in _MULTILINE:
            event_dict[key] = _escape(value)
    return event_dict


_MULTILINE = frozenset({"exception", "stack"})  # tracebacks, rendered by the renderer itself


def _scrubbed(render: Callable[[WrappedLogger, str, EventDict], str]) -> Processor:
    def render_scrubbed(logger: WrappedLogger, name: str, event_dict: EventDict) -> str:
        return scrub(render(logger, name, event_dict))

    return render_scrubbed


class _Timestamp:
    """ISO-8601 UTC timestamps with microseconds; the date part is formatted once a second."""

    __slots__ = ("_cached",)

    def __init__(self) -> None:
        self._cached = (-1, "")  # one tuple, swapped atomically (stdlib logs come from threads)

    def now(self) -> str:
        """The current time, rendered."""
        now = time.time()
        second = int(now)
        cached_second, prefix = self._cached
        if second != cached_second:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._cached = (second, prefix)
        return f"{prefix}.{int((now - second) * 1e6):06d}Z"

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        event_dict["timestamp"] = self.now()
        return event_dict


class AccessLines:
    """The access log's JSON lines, rendered straight into the sink.

    One line per request is the hottest logging there is, and structlog's bound logger,
    processor chain and context merge cost about three times the rendering itself. The line
    is the one the chain would write (time, level, event first; the fields; the worker), with
    two differences by design: the request's ids come from its fields, not from context
    variables, and no field is redacted by name because the access fields carry no secret or
    content by construction (a test holds their names to that). Values are still scrubbed.
    """

    __slots__ = ("_clock", "_worker", "_write", "sink")

    def __init__(self, sink: LogSink, clock: _Timestamp, worker: int | None) -> None:
        self.sink = sink
        self._write = sink.write
        self._clock = clock
        self._worker = worker

    def info(self, event: str, **fields: Any) -> None:
        """Write one line at level info."""
        line: dict[str, Any] = {"timestamp": self._clock.now(), "level": "info", "event": event}
        line.update(fields)
        if self._worker is not None:
            line.setdefault("worker", self._worker)
        self._write(scrub(one_line(_encoder.encode(line).decode())))


_access_lines: AccessLines | None = None


def access_logger() -> Any:
    """What the observer writes access lines to: the direct JSON writer when logging renders
    JSON at level info or below, otherwise structlog's ``tiergate.access`` logger (console
    rendering, or a level that drops info lines)."""
    if _access_lines is not None:
        return _access_lines
    return structlog.get_logger("tiergate.access").bind()


def render_json(_: WrappedLogger, __: str, event_dict: EventDict) -> str:
    """One JSON object per line (time, level, event first), encoded by msgspec."""
    line = {
        "timestamp": event_dict.pop("timestamp", None),
        "level": event_dict.pop("level", None),
        "event": event_dict.pop("event", None),
    }
    line.update(event_dict)
    return one_line(_encoder.encode(line).decode())


def _console(telemetry: TelemetrySettings, stream: TextIO) -> bool:
    """Console rendering when asked for, or with ``auto`` when writing to a terminal."""
    fmt = telemetry.log_format
    return fmt == "console" or (fmt == "auto" and stream.isatty())


def _configure_stdlib(level: int, sink: LogSink, chain: list[Processor], render: Processor) -> None:
    handler = _SinkHandler(sink)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=chain,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, render],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    for name in ("litestar", "uvicorn", "uvicorn.error"):
        own = logging.getLogger(name)  # frameworks' own handlers: route through ours instead
        for old in list(own.handlers):
            own.removeHandler(old)
        own.propagate = True


def _tag_worker(worker: int) -> Processor:
    def tag(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("worker", worker)
        return event_dict

    return tag


def configure_logging(
    telemetry: TelemetrySettings, stream: TextIO | None = None, *, worker: int | None = None
) -> LogSink:
    """Configure structlog and the standard library for this process; return the sink.

    Call once, after the app is built (frameworks configure logging while they build);
    ``close()`` the sink at exit. ``stream`` (default stderr) is ignored when
    ``telemetry.log_file`` is set. ``worker`` (one of several) tags every line.
    """
    if telemetry.log_file is not None:
        telemetry.log_file.parent.mkdir(parents=True, exist_ok=True)
        out: TextIO = open_log_file(telemetry.log_file)
        sink = LogSink(out, owns_stream=True, path=telemetry.log_file)
    else:
        out = stream or sys.stderr
        sink = LogSink(out)
    level = _LEVELS[telemetry.log_level]
    json_lines = not _console(telemetry, out)
    render = (
        _scrubbed(render_json)
        if json_lines
        else _scrubbed(
            # Plain tracebacks: the default (rich, when installed) prints every frame's local
            # variables (a password, a request's headers) and wraps long values across lines,
            # where the scrubbing no longer sees a credential whole.
            structlog.dev.ConsoleRenderer(
                colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
            )
        )
    )
    clock = _Timestamp()
    chain: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        clock,
        make_redactor(telemetry.capture_content),
    ]
    if worker is not None:
        chain.append(_tag_worker(worker))
    tail: list[Processor] = [structlog.processors.format_exc_info if json_lines else _printable]
    structlog.configure(
        processors=[*chain, *tail, render],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_factory(sink),
        context_class=dict,
        cache_logger_on_first_use=True,
    )
    _configure_stdlib(level, sink, [*chain, *tail], render)
    global _access_lines  # noqa: PLW0603  # configured once per process, like structlog itself
    direct = json_lines and level <= logging.INFO
    _access_lines = AccessLines(sink, clock, worker) if direct else None
    return sink


def _factory(sink: LogSink) -> Callable[..., _SinkLogger]:
    logger = _SinkLogger(sink)

    def factory(*_: Any) -> _SinkLogger:
        return logger

    return factory
