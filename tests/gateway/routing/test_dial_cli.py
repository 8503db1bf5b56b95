"""``tiergate router dial``: refusals before any call (the call itself: test_live_dial.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gateway.routing.dial_cli import TOKEN_ENV, main
from tests.processes import free_port


def test_a_share_outside_zero_to_one_is_a_usage_error() -> None:
    """1.5 and words other than 'clear' stop argparse (exit 2)."""
    for bad in ("1.5", "lots"):
        with pytest.raises(SystemExit) as exited:
            main([bad])
        assert exited.value.code == 2


def test_without_a_token_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """No --admin-token-file and no TIERGATE_ADMIN_TOKEN: exit 2."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["0.2"]) == 2


def test_an_unreachable_gateway_is_exit_1(tmp_path: Path) -> None:
    """A port nobody listens on: one line, exit 1, nothing printed to stdout."""
    token = tmp_path / "admin"
    token.write_text("x" * 32)
    out = io.StringIO()
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["0.2", "--url", url, "--admin-token-file", str(token)], out=out) == 1
    assert out.getvalue() == ""
