"""``tiergate serve``'s process settings: what the server sets around uvicorn's run."""

from __future__ import annotations

import socket
import sys

import pytest
import uvicorn

from gateway.composition import served
from gateway.config.settings import AuthSettings, Settings
from gateway.http import server


def _settings() -> Settings:
    return Settings(auth=AuthSettings(enabled=False))


def test_serving_shortens_the_gil_switch_interval_and_restores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While serving, a thread that wants the GIL (the event loop, while the span exporter's
    thread encodes a batch) waits at most 0.5 ms per switch, not CPython's 5 ms; the process's
    own value comes back once the server stops."""
    seen: list[float] = []

    def fake_run(self: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        seen.append(sys.getswitchinterval())

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    before = sys.getswitchinterval()
    with socket.socket() as sock:
        server._run(_settings(), served, sock, None)
    assert seen == [server.GIL_SWITCH_INTERVAL_S]
    assert before > server.GIL_SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == before


def test_the_default_interval_is_restored_when_serving_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failing_run(self: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        raise OSError("listening failed")

    monkeypatch.setattr(uvicorn.Server, "run", failing_run)
    before = sys.getswitchinterval()
    with socket.socket() as sock, pytest.raises(OSError, match="listening failed"):
        server._run(_settings(), served, sock, None)
    assert sys.getswitchinterval() == before
