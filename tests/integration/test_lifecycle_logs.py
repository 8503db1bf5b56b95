"""``tiergate serve`` says when it starts (where, how many workers, which tiers, which key store)
and when SIGTERM drains it (requests in flight, then how many finished and how many were cut),
never with a secret of its configuration (real processes, real sockets)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, fixed_rate_streamer, tiers_config
from tests.processes import free_port, patience

ADMIN = "lifecycle-admin-token-0123456789abcdef"
UPSTREAM_KEY = "upstream-api-key-shhh-0123456789"
REPLICA_PASSWORD = "replica-url-password-9876"
REDIS_PASSWORD = "redis-url-password-5432"


def _events(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    parsed = (json.loads(line) for line in gw.log_text().splitlines() if line[:1] == "{")
    return [line for line in parsed if line.get("event") == event]


def _stopped(gw: GatewayProcess) -> bool:
    """SIGTERM; whether the process ended as a drained server does (uvicorn re-raises the
    signal once it has shut down: -15)."""
    proc = gw._proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGTERM)
    return proc.wait(timeout=patience(30)) in (0, -signal.SIGTERM)


def test_start_and_stop_are_logged_without_secrets(tmp_path: Path) -> None:
    """server.started names the bind address, workers, tiers (replica counts, models) and the
    key store; SIGTERM logs server.draining then server.stopped; no key, token or password."""
    keys = tmp_path / "keys.yaml"
    record, key = issue_key("life", KeyPolicy(), now=time.time())
    FileKeyStore(keys).put_sync(record)
    port = free_port()
    replica = f"http://user:{REPLICA_PASSWORD}@127.0.0.1:{port}"
    tiers = tiers_config([replica, f"http://127.0.0.1:{free_port()}"], [replica])
    tiers["fast"]["api_key"] = UPSTREAM_KEY
    config = {
        "auth": {"keys_file": str(keys), "admin_token": ADMIN},
        "redis": {"url": f"redis://:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0"},
        "tiers": tiers,
        "telemetry": {"log_format": "json"},
    }
    gw = GatewayProcess(config)
    try:
        gw.start()
        deadline = time.monotonic() + patience(5)
        while not _events(gw, "server.started"):
            assert time.monotonic() < deadline, gw.log_text()[-3000:]
            time.sleep(0.05)
        assert _stopped(gw)
        (started,) = _events(gw, "server.started")
        assert started["level"] == "info"
        assert started["host"] == "127.0.0.1"
        assert started["port"] == gw.port
        assert started["workers"] == 1
        assert started["tiers"] == {
            "fast": {"model": "tiergate-fast", "replicas": 2},
            "precise": {"model": "tiergate-precise", "replicas": 1},
        }
        assert started["auth"] == "file"
        assert started["ratelimit"] == "memory"
        assert started["admin_api"] is True
        (draining,) = _events(gw, "server.draining")
        assert draining["in_flight"] == 0
        assert draining["grace_s"] == 30.0
        (stopped,) = _events(gw, "server.stopped")
        assert (stopped["drained"], stopped["cut"]) == (0, 0)
        text = gw.log_text()
        for secret in (ADMIN, UPSTREAM_KEY, REPLICA_PASSWORD, REDIS_PASSWORD, key):
            assert secret not in text
    finally:
        gw.stop()


@pytest.mark.slow  # a drain of real streams: make test-all and CI
def test_sigterm_counts_the_streams_it_drained_and_the_ones_it_cut(tmp_path: Path) -> None:
    """Two streams in flight at SIGTERM with a 3 s grace: the short one finishes (drained), the
    long one is cut at the deadline; the lines say 2 in flight, 1 drained, 1 cut."""
    with fixed_rate_streamer(tmp_path, "tiergate-fast", tokens=1000) as upstream:
        config = {
            "auth": {"enabled": False},
            "server": {"shutdown_grace_s": 3},
            "tiers": tiers_config([upstream], [upstream]),
            "telemetry": {"log_format": "json"},
        }
        gw = GatewayProcess(config)
        try:
            gw.start()
            results: list[str] = []

            def stream(tokens: int, seen: threading.Event) -> None:
                body = {
                    "model": "fast",
                    "stream": True,
                    "max_tokens": tokens,
                    "messages": [{"role": "user", "content": "pace 20/s"}],
                }
                text = ""
                try:
                    with httpx.stream(
                        "POST", gw.url + "/v1/chat/completions", json=body, timeout=30
                    ) as resp:
                        for chunk in resp.iter_text():
                            seen.set()
                            text += chunk
                except httpx.HTTPError:
                    pass
                seen.set()
                results.append(text)

            first_events = [threading.Event(), threading.Event()]
            threads = [
                threading.Thread(target=stream, args=(n, seen))
                for n, seen in zip((30, 400), first_events, strict=True)
            ]
            for thread in threads:
                thread.start()
            for seen in first_events:
                assert seen.wait(patience(10))
            assert _stopped(gw)
            for thread in threads:
                thread.join(timeout=patience(10))
            assert sum("[DONE]" in text for text in results) == 1
            (draining,) = _events(gw, "server.draining")
            assert draining["in_flight"] == 2
            (stopped,) = _events(gw, "server.stopped")
            assert (stopped["drained"], stopped["cut"]) == (1, 1)
            assert stopped["drain_s"] >= 2.5
        finally:
            gw.stop()


@pytest.mark.slow  # a drain of real streams: make test-all and CI
def test_with_workers_the_supervisor_announces_once_and_each_worker_drains() -> None:
    """--workers 2: one server.started (workers 2) from the supervisor, a server.worker_started
    per worker; on SIGTERM each writes its own server.draining and server.stopped."""
    dead = [f"http://127.0.0.1:{free_port()}"]
    config = {
        "auth": {"enabled": False},
        "tiers": tiers_config(dead, dead),
        "telemetry": {"log_format": "json"},
    }
    gw = GatewayProcess(config, workers=2)
    try:
        gw.start()
        deadline = time.monotonic() + patience(10)
        while len(_events(gw, "server.worker_started")) < 2:
            assert time.monotonic() < deadline, gw.log_text()[-3000:]
            time.sleep(0.05)
        assert sorted(x["worker"] for x in _events(gw, "server.worker_started")) == [0, 1]
        assert _stopped(gw)
        (started,) = _events(gw, "server.started")
        assert (started["workers"], started["port"]) == (2, gw.port)
        assert "worker" not in started
        assert sorted(x["worker"] for x in _events(gw, "server.draining")) == [0, 1]
        assert sorted(x["worker"] for x in _events(gw, "server.stopped")) == [0, 1]
    finally:
        gw.stop()
