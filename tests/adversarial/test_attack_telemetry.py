"""Logs, metrics and traces under a hostile client, a careless operator and an odd backend.

Real ``tiergate serve`` processes, real backends (the simulator, or a recording backend that
answers with hostile strings: ``tests/adversarial/telemetry_upstream.py``), real OTLP
receivers on loopback sockets (one that decodes, one that accepts and never answers).

- T1: an OTLP collector that accepts connections and never answers held a stopping gateway
  for 20 s with nothing in flight (13 s for a refused port): the span flush at shutdown was
  bounded only by the exporter's own timeouts, twice over.
- T2: a backend's ``id`` and ``model`` went into the client span whole (300 KB each here) and
  every ``finish_reason`` of a stream was appended to one attribute: one answer made a span
  of megabytes, which the bounded span queue holds 2,048 of and a collector refuses whole.
- T3: a caller's ``tracestate`` (32 members, 6.5 KB) was sent on to every backend verbatim.
- T4: a secret in the collector's URL (``…/v1/traces?api-key=…``) was written to the log in
  every export retry's warning.
- T5: ``log_format: console`` rendered tracebacks with every frame's local variables
  (structlog's rich formatter), so a password or key held in a local reached the log.
- T6: a caller's ``model`` with terminal escapes and no space (``ESC[1A ESC[2K``: up a line,
  erase it) was written raw by ``log_format: console`` (the format a terminal gets by
  default), so a caller could rewrite what an operator sees; and U+2028, U+0085, VT or FF
  (line breaks to ``str.splitlines``, many viewers and log shippers) split a line in two,
  in JSON lines too.
- T7: a request whose body stalled was answered 408 (``server.body_timeout_s``) but logged
  and counted as 499 ``ClientGone``, as if the caller had left.
- T8: with ``--workers 2`` a scrape served its own worker's live counters beside the other's
  last published ones (up to 1 s old), so a counter series went down from one scrape to the
  next whenever the other worker answered (4 then 3): Prometheus reads a drop as a restart.

Every gateway here is forked from a pre-imported fork server (tests/integration/
forked_gateway.py): no test is about a gateway's start or its interpreter, and a fork serves,
logs, exports and stops as ``python -m gateway serve`` does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.adversarial.telemetry_stack import otlp_receiver, recording_upstream
from tests.gateway.telemetry.test_export import http_receiver
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.processes import free_port, patience, silent_port
from tests.stack import Backends, gateway_in_front, running_backends, running_stack

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

__all__ = ["http_receiver"]  # a fixture of this module too

Received = list[tuple[str, trace_service_pb2.ExportTraceServiceRequest]]
Hostile = tuple[GatewayProcess, Received, Path]
CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    """The default zero-latency fast and precise simulators, shared by the module's gateways
    (no test sets a fault or reads their counters)."""
    with running_backends() as running:
        yield running


@contextmanager
def silent_collector() -> Iterator[str]:
    """A TCP port that accepts every connection and never answers: its URL."""
    with silent_port() as port:
        yield f"http://127.0.0.1:{port}"


def _traced(config: dict[str, Any], url: str, **telemetry: Any) -> dict[str, Any]:
    config["tiers"] = {
        "fast": {"model": "tiergate-fast", "replicas": [url]},
        "precise": {"model": "tiergate-precise", "replicas": [url]},
    }
    config["telemetry"] = {"tracing": True, "log_format": "json", **telemetry}
    return config


def _spans(received: Received) -> list[Any]:
    return [
        span
        for _, request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]


def _wait_spans(received: Received, count: int) -> list[Any]:
    deadline = time.monotonic() + patience(10)
    while len(_spans(received)) < count:
        assert time.monotonic() < deadline, f"{len(_spans(received))} spans of {count}"
        time.sleep(0.05)
    return _spans(received)


def _value(attribute: Any) -> Any:
    value = attribute.value
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value_of(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _value_of(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


# --- T1: a collector that never answers -------------------------------------------------


def test_a_silent_collector_does_not_hold_a_stopping_gateway(backends: Backends) -> None:
    """Spans queued for a collector that accepts and never answers are given up within a
    few seconds of SIGTERM, not the exporter's timeouts (20 s before); requests meanwhile
    are answered as usual and the stop is still logged."""
    with silent_collector() as collector:

        def traced(config: dict[str, Any], _: Backends) -> None:
            config["telemetry"] = {"tracing": True, "log_format": "json", "access_log": False}

        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        with gateway_in_front(
            backends, configure=traced, env=env, gateway_type=ForkedGateway
        ) as stack:
            gateway = stack.gateway
            assert isinstance(gateway, ForkedGateway)
            with httpx.Client(base_url=gateway.url, timeout=30) as client:
                for _ in range(30):
                    started = time.perf_counter()
                    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
                    assert time.perf_counter() - started < 2.0  # never waits on the collector
            proc = gateway._child
            assert proc is not None
            stopping = time.monotonic()
            os.kill(gateway.pid, signal.SIGTERM)
            proc.join(timeout=60)
            took = time.monotonic() - stopping
            assert proc.exitcode is not None, "still running 60 s after SIGTERM"
            log = gateway.log_text()
    assert '"server.stopped"' in log
    assert '"telemetry.spans_unflushed"' in log  # said, not silent
    assert took < 8.0, f"the gateway took {took:.1f} s to stop with nothing in flight"


# --- T2 and T3: one traced gateway in front of a hostile recording backend ----------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    """A traced gateway (auth off), its OTLP receiver's list and the file of headers its
    backend got: ``telemetry_upstream`` answering with 300,000-character ids and models and
    streams of 500 finish reasons. T2 and T3 share it: each clears the list first and waits
    for every span of its requests, and reads only the header lines its requests added."""
    tmp_path = tmp_path_factory.mktemp("hostile")
    args = ("--id-bytes", "300000", "--reasons", "500")
    with (
        otlp_receiver() as (endpoint, received),
        recording_upstream(tmp_path, *args) as (url, record),
    ):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        config = _traced({"auth": {"enabled": False}}, url)
        with ForkedGateway(config, env=env) as gateway:
            gateway.wait_until_ready()
            yield gateway, received, record


def test_a_backends_long_strings_are_clipped_in_spans(hostile: Hostile) -> None:
    """A backend answering with a 300,000-character ``id`` and ``model``, and a stream with
    500 events that each carry a ``finish_reason``: every string attribute of every span
    stays short and the finish reasons list stays bounded."""
    gateway, received, _ = hostile
    received.clear()
    whole = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert whole.status_code == 200
    assert len(whole.json()["id"]) == 300000  # the caller still gets the answer
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30
    ) as streamed:
        assert streamed.status_code == 200
        streamed.read()
    spans = _wait_spans(received, 4)
    client_spans = [s for s in spans if s.name.startswith("chat ")]
    assert len(client_spans) == 2
    for span in spans:
        for attribute in span.attributes:
            value = _value(attribute)
            if isinstance(value, str):
                assert len(value) <= 256, (span.name, attribute.key, len(value))
            if isinstance(value, list):
                assert len(value) <= 128, (span.name, attribute.key, len(value))
    ids = [_value(a) for s in client_spans for a in s.attributes if a.key == "gen_ai.response.id"]
    assert ids
    assert all(i.startswith("rrrr") for i in ids)  # clipped, not dropped


def test_a_callers_huge_tracestate_is_not_sent_to_the_backend(hostile: Hostile) -> None:
    """A 32-member, 6.5 KB ``tracestate`` stops at the gateway (W3C lets a hop drop one over
    512 characters); a short one is still passed on, and the caller's trace is still joined."""
    gateway, received, record = hostile
    received.clear()
    earlier = len(record.read_text(encoding="utf-8").splitlines())
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    parent = f"00-{trace_id}-b7ad6b7169203331-01"
    huge = ",".join(f"k{i}=" + "v" * 200 for i in range(32))
    for state in (huge, "vendor=abc"):
        headers = {"traceparent": parent, "tracestate": state}
        answer = httpx.post(
            gateway.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=30
        )
        assert answer.status_code == 200
    spans = _wait_spans(received, 4)
    lines = record.read_text(encoding="utf-8").splitlines()[earlier:]
    sent = [json.loads(line) for line in lines]
    assert len(sent) == 2
    assert all(h["traceparent"].startswith(f"00-{trace_id}-") for h in sent)
    assert "tracestate" not in sent[0]
    assert sent[1]["tracestate"] == "vendor=abc"
    assert all(len(span.trace_state) <= 512 for span in spans)
    assert all(span.trace_id.hex() == trace_id for span in spans)


# --- T4: the collector's URL -----------------------------------------------------------


def test_a_secret_in_the_collectors_url_is_not_logged(backends: Backends) -> None:
    """An OTLP endpoint with a password and an ``api-key`` query parameter, refusing
    connections: the exporter's retry warnings are logged without either."""
    port = free_port()
    endpoint = f"http://otel:Pw-7c1f9e@127.0.0.1:{port}/v1/traces?api-key=Key-5d2b8a&tenant=t1"

    def traced(config: dict[str, Any], _: Backends) -> None:
        config["telemetry"] = {"tracing": True, "log_format": "json", "access_log": False}

    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with gateway_in_front(backends, configure=traced, env=env, gateway_type=ForkedGateway) as stack:
        gateway = stack.gateway
        assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT).status_code == 200
        deadline = time.monotonic() + patience(15)
        while "exporting spans batch" not in gateway.log_text():
            assert time.monotonic() < deadline, gateway.log_text()[-2000:]
            time.sleep(0.1)
        gateway.stop()
        log = gateway.log_text()
    assert "Key-5d2b8a" not in log
    assert "Pw-7c1f9e" not in log
    assert "tenant=t1" in log  # the rest of the URL still says where spans were going


# --- T5: console tracebacks ------------------------------------------------------------


def _fail_holding_secrets(seed: str) -> None:
    """Raise with a password and a long credential in local variables, both built from
    ``seed`` (a source line shown in a traceback must not hold them)."""
    password = f"redis-Pw-{seed[::-1]}"
    authorization = "Basic " + seed.upper() * 12  # longer than a console line
    raise ConnectionError(f"lost {len(password) + len(authorization)}")


def test_console_tracebacks_show_no_local_variables(tmp_path: Path) -> None:
    """``log_format: console``: a logged exception's traceback names the frames and the
    error, never a frame's local variables (a password, a credential split across lines)."""
    script = tmp_path / "fail.py"
    log_file = tmp_path / "console.log"
    script.write_text(
        "import structlog\n"
        "from gateway.config.settings import TelemetrySettings\n"
        "from gateway.telemetry.logging import configure_logging\n"
        "from tests.adversarial.test_attack_telemetry import _fail_holding_secrets\n"
        f"settings = TelemetrySettings(log_format='console', log_file={str(log_file)!r})\n"
        "sink = configure_logging(settings)\n"
        "try:\n"
        "    _fail_holding_secrets('2e7a9c14')\n"
        "except ConnectionError:\n"
        "    structlog.get_logger('t').exception('health.round_failed')\n"
        "sink.close()\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = log_file.read_text(encoding="utf-8")
    assert "health.round_failed" in text
    assert "ConnectionError" in text
    assert "_fail_holding_secrets" in text
    assert "redis-Pw-41c9a7e2" not in text
    assert "2E7A9C142E7A9C14" not in text


# --- T6: control characters in log lines -------------------------------------------------

HOSTILE_MODELS = (
    "\x1b[1A\x1b[2K\x1b[1G2026-12-07T00:00:00Z\xa0[info\xa0]\xa0forged\x1b]0;title\x07",
    "fast\u2028{\\u0022event\\u0022:1}\x85next\x0bvt\x0cff\u2029ps\x1c\x7f",
)


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_a_callers_control_characters_never_reach_a_log_line_raw(
    tmp_path: Path, backends: Backends, log_format: str
) -> None:
    """Models full of terminal escapes and Unicode line breaks: every access line is one
    line (to ``str.splitlines`` as to ``split("\\n")``) and holds no escape character."""
    log_file = tmp_path / "gateway.log"

    def logged(config: dict[str, Any], _: Backends) -> None:
        config["telemetry"] = {"log_format": log_format, "log_file": str(log_file)}

    with gateway_in_front(backends, configure=logged, gateway_type=ForkedGateway) as stack:
        for model in HOSTILE_MODELS:
            answer = stack.post({**CHAT, "model": model})
            assert answer.status_code == 404  # the model is unknown; the line is still written
        deadline = time.monotonic() + patience(10)
        while log_file.read_text(encoding="utf-8").count("request.finished") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stack.gateway.stop()
    text = log_file.read_text(encoding="utf-8")
    assert text.count("request.finished") == 2
    assert text.splitlines() == text.split("\n")[:-1]
    for char in ("\x1b", "\x07", "\x7f", "\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c"):
        assert char not in text, repr(char)


# --- one access line and one count per request, whatever its end --------------------------

ADMIN = "telemetry-attack-admin-token-0123456789"
SLOW_FAST = (
    "--profile",
    "fast",
    "--model",
    "tiergate-fast",
    "--decode-tokens-per-s",
    "40",
    "--output-tokens",
    "60",
)  # fmt: skip (1.5 s streams)
FAILING_PRECISE = ("--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "0",
                   "--fail-500", "1.0")  # fmt: skip


def _key(keys_file: Path, policy: KeyPolicy | None = None) -> str:
    """A new key of tenant ``acme`` written to ``keys_file`` (what ``tiergate keys create``
    writes, without starting an interpreter for it)."""
    record, token = issue_key("acme", policy or KeyPolicy(), now=time.time(), name="k")
    FileKeyStore(keys_file).put_sync(record)
    return token


def _raw(port: int, head: bytes, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head + body)
    return sock


def _post_head(path: str, key: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _requests_total(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tiergate_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            status = labels.split('status_class="', 1)[1].split('"', 1)[0]
            counts[status] = counts.get(status, 0.0) + float(value)
    return counts


def _send_every_kind(gateway: GatewayProcess, key: str, one_rpm: str) -> int:
    """One request of each ending; how many were sent."""
    auth = {"Authorization": f"Bearer {key}"}
    chat = {**CHAT, "max_tokens": 60}
    url = gateway.url + "/v1/chat/completions"
    sent: list[int] = []
    with httpx.Client(timeout=30) as client:
        sent.append(client.post(url, json=chat, headers=auth).status_code)
        with client.stream("POST", url, json={**chat, "stream": True}, headers=auth) as r:
            r.read()
            sent.append(r.status_code)
        sent.append(client.post(url, content=b"{not json", headers=auth).status_code)
        sent.append(client.post(url, json=chat).status_code)
        sent.append(client.post(url, json={**chat, "model": "nope"}, headers=auth).status_code)
        one = {"Authorization": f"Bearer {one_rpm}"}
        sent += [client.post(url, json=chat, headers=one).status_code for _ in range(2)]
        sent.append(client.post(url, json={**chat, "model": "precise"}, headers=auth).status_code)
    assert sent == [200, 200, 400, 401, 404, 200, 429, 502], sent
    port = gateway.port
    big = _raw(port, _post_head("/v1/chat/completions", key, 10_000_000))
    assert big.recv(12).startswith(b"HTTP/1.1 413")
    big.close()
    stalled = _raw(port, _post_head("/v1/chat/completions", key, 100), b'{"model"')
    assert stalled.recv(12).startswith(b"HTTP/1.1 408")
    stalled.close()
    body = json.dumps({**chat, "stream": True}).encode()
    leaving = _raw(port, _post_head("/v1/chat/completions", key, len(body)), body)
    assert b"data: " in leaving.recv(65536)
    leaving.close()  # mid-stream
    body = json.dumps(chat).encode()
    _raw(port, _post_head("/v1/chat/completions", key, len(body)), body).close()
    return len(sent) + 4


def test_every_request_has_one_access_line_and_one_count(tmp_path: Path) -> None:
    """200s (whole and streamed), 400, 401, 404, 413, 429, a backend's 500 (502), a body
    that stalls (408), a caller leaving mid-stream and one leaving before its answer: as many
    access lines as requests, each with the status the caller was sent, and
    ``tiergate_requests_total`` counts each once, in the class of that status."""
    keys_file = tmp_path / "keys.yaml"
    key = _key(keys_file)
    one_rpm = _key(keys_file, KeyPolicy(rpm=1))

    def configure(config: dict[str, Any], _: Backends) -> None:
        config["auth"] = {"enabled": True, "store": "file", "keys_file": str(keys_file),
                          "admin_token": ADMIN}  # fmt: skip
        config["server"] = {"body_timeout_s": 1.0}
        config["telemetry"] = {"log_format": "json", "access_log": True}

    with running_stack(
        sims=(SLOW_FAST, FAILING_PRECISE), configure=configure, gateway_type=ForkedGateway
    ) as stack:
        gateway = stack.gateway
        gateway.wait_until_ready()
        expected = _send_every_kind(gateway, key, one_rpm)
        deadline = time.monotonic() + patience(20)
        while len(gateway.access_lines()) < expected:
            assert time.monotonic() < deadline, gateway.log_text()[-3000:]
            time.sleep(0.05)
        counted = _requests_total(gateway.url)
        gateway.stop()
        lines = gateway.access_lines()
    assert len(lines) == expected, [line["status"] for line in lines]
    by_class: dict[str, float] = {}
    for line in lines:
        klass = f"{line['status'] // 100}xx"
        by_class[klass] = by_class.get(klass, 0.0) + 1
    assert counted == by_class
    ends = [(line["status"], line["outcome"]) for line in lines]
    assert ends.count((499, "ClientGone")) == 1, ends  # the caller that left before its answer
    assert (200, "client_disconnect") in ends
    assert (413, "PayloadTooLarge") in ends
    assert (408, "BodyTimedOut") in ends, ends  # the caller was sent 408, not 499


# --- two workers: one exposition that adds up and only goes up -----------------------------


def _samples(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """``name{labels}`` -> value of every sample of ``names``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(names):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def test_two_workers_metrics_add_up_and_never_go_down(backends: Backends) -> None:
    """Two workers, a trickle of requests, /metrics scraped on fresh connections (either
    worker answers): every counter series only grows from scrape to scrape (Prometheus takes
    a drop for a restart and counts the whole value again), and once traffic stops the sum
    over workers is the number of requests, as is the latency histogram's count, whose sum
    (seconds) matches the access lines' ``duration_ms``."""

    def configure(config: dict[str, Any], _: Backends) -> None:
        config["telemetry"] = {"log_format": "json", "access_log": True}

    names = ("tiergate_requests_total{", "tiergate_request_duration_seconds_count{")
    sent = 0
    drops: list[tuple[str, float, float]] = []
    with gateway_in_front(
        backends, configure=configure, workers=2, gateway_type=ForkedGateway
    ) as stack:
        gateway = stack.gateway
        last: dict[str, float] = {}
        for _ in range(40):
            assert stack.post(CHAT).status_code == 200
            sent += 1
            with httpx.Client(timeout=10) as fresh:  # a new connection: either worker
                now = _samples(fresh.get(gateway.url + "/metrics").text, names)
            drops += [(s, last[s], v) for s, v in now.items() if v < last.get(s, 0.0)]
            last.update(now)
            time.sleep(0.05)
        deadline = time.monotonic() + patience(10)
        while True:
            text = httpx.get(gateway.url + "/metrics", timeout=10).text
            total = sum(_samples(text, ("tiergate_requests_total{",)).values())
            if total == sent or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        lines = gateway.access_lines()
    assert total == sent
    assert not drops, drops[:5]
    assert sum(_samples(text, ("tiergate_request_duration_seconds_count{",)).values()) == sent
    seconds = sum(_samples(text, ("tiergate_request_duration_seconds_sum{",)).values())
    logged = sum(line["duration_ms"] for line in lines) / 1000.0
    assert len(lines) == sent
    assert abs(seconds - logged) < 0.001 * sent + 0.01, (seconds, logged)


# --- a limit, pinned: a caller's sampled traceparent is traced whatever the ratio -----------


@pytest.mark.parametrize("trusted", [False, True])
def test_a_callers_sampled_traceparent_is_traced_at_a_ratio_of_zero_only_when_trusted(
    tmp_path: Path, backends: Backends, http_receiver: tuple[str, Received], trusted: bool
) -> None:
    """A caller's sampled ``traceparent`` buys no trace at ``trace_sample_ratio: 0`` (a
    refused caller, 401, could otherwise spend the tracing budget); with
    ``trust_caller_sampling: true`` it is traced, refused ones (401) included."""
    endpoint, received = http_receiver
    keys_file = tmp_path / "keys.yaml"
    _key(keys_file)

    def configure(config: dict[str, Any], _: Backends) -> None:
        config["auth"] = {"enabled": True, "store": "file", "keys_file": str(keys_file)}
        config["telemetry"] = {
            "tracing": True,
            "trace_sample_ratio": 0.0,
            "log_format": "json",
            "trust_caller_sampling": trusted,
        }

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    sampled = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with gateway_in_front(
        backends, configure=configure, env=env, gateway_type=ForkedGateway
    ) as stack:
        url = stack.gateway.url + "/v1/chat/completions"
        assert httpx.post(url, json=CHAT).status_code == 401
        assert httpx.post(url, json=CHAT, headers=sampled).status_code == 401
        if trusted:
            _wait_spans(received, 1)
        stack.gateway.stop()  # flushes: nothing else was sampled
    spans = _spans(received)
    if not trusted:
        assert spans == []
        return
    assert [s.name for s in spans] == ["POST /v1/chat/completions"]
    status = [_value(a) for a in spans[0].attributes if a.key == "http.response.status_code"]
    assert status == [401]


# --- a log file moved away by logrotate -------------------------------------------------


def test_a_log_file_moved_away_is_created_again(tmp_path: Path, backends: Backends) -> None:
    """``telemetry.log_file`` renamed while the gateway runs (logrotate's default, without
    ``copytruncate``): the next lines go to a new file at the configured path, not on into
    the renamed one."""
    log_file = tmp_path / "gateway.log"

    def logged(config: dict[str, Any], _: Backends) -> None:
        config["telemetry"] = {"log_format": "json", "log_file": str(log_file)}

    with gateway_in_front(backends, configure=logged, gateway_type=ForkedGateway) as stack:
        first = stack.post(CHAT)
        assert first.status_code == 200
        deadline = time.monotonic() + patience(10)
        while first.headers["x-request-id"] not in log_file.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        log_file.rename(tmp_path / "gateway.log.1")
        second = stack.post(CHAT)
        assert second.status_code == 200
        deadline = time.monotonic() + patience(10)
        while not (log_file.exists() and second.headers["x-request-id"] in log_file.read_text()):
            assert time.monotonic() < deadline, "the line went on into the renamed file"
            time.sleep(0.05)
    assert first.headers["x-request-id"] in (tmp_path / "gateway.log.1").read_text()
