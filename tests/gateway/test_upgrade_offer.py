"""``Upgrade`` offers are renamed in the head before parsing, never in a body (unit level; the
served behaviour is tested over raw sockets in tests/integration/test_native_path.py)."""

from __future__ import annotations

from gateway.http_protocol import _without_upgrade

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"


def test_a_head_without_an_offer_is_the_same_object() -> None:
    """The usual request is passed through untouched (no copy)."""
    data = HEAD + b"Content-Length: 2\r\n\r\n{}"
    assert _without_upgrade(data) is data


def test_every_upgrade_header_of_the_head_is_renamed_in_any_case() -> None:
    """Two offers, in two cases, with spaces before the colon: both renamed, nothing else."""
    data = HEAD + b"Connection: Upgrade\r\nUpgrade: h2c\r\nUPGRADE : websocket\r\n\r\n"
    out = _without_upgrade(data)
    assert out == (
        HEAD
        + b"Connection: Upgrade\r\nx-ignored-upgrade: h2c\r\nx-ignored-upgrade: websocket\r\n\r\n"
    )


def test_a_body_that_looks_like_a_header_is_left_alone() -> None:
    """Bytes after the head are the body's: a line there that reads like a header stays."""
    body = b"x\r\nUpgrade: h2c\r\n"
    data = HEAD + b"Upgrade: h2c\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    out = _without_upgrade(data)
    assert out.endswith(b"\r\n\r\n" + body)
    assert out.startswith(HEAD + b"x-ignored-upgrade: h2c\r\n")


def test_a_head_still_arriving_is_searched_as_far_as_it_goes() -> None:
    """Without the blank line yet, the whole chunk is head."""
    assert _without_upgrade(HEAD + b"upgrade: h2c\r\n") == HEAD + b"x-ignored-upgrade: h2c\r\n"
