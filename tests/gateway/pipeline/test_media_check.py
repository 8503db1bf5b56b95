"""docs/security.md, "Media URLs": each refusal in its list, with the code the doc names.

``check_media`` is what the request path runs; these call it directly (no processes). Hosts that
are spelled as addresses resolve without DNS; the resolver is replaced where a test needs it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from gateway.pipeline import media
from gateway.pipeline.media import check_media
from policies.errors import InvalidRequest
from policies.fields import MediaUrl


async def refusal(url: str, *, remote_allowed: bool = True) -> str:
    """The error code ``check_media`` refuses ``url`` with."""
    with pytest.raises(InvalidRequest) as caught:
        await check_media([MediaUrl("messages[0].content[1]", url)], remote_allowed=remote_allowed)
    assert caught.value.param == "messages[0].content[1]"
    return str(caught.value.code)


async def test_inline_media_passes_even_where_remote_media_is_off() -> None:
    """``data:`` URLs always pass."""
    await check_media([MediaUrl("p", "data:image/png;base64,AA==")], remote_allowed=False)


async def test_remote_media_is_refused_by_default() -> None:
    """``allow_remote_media`` false: 400 ``remote_media_not_allowed``."""
    assert await refusal("https://93.184.215.14/x.png", remote_allowed=False) == (
        "remote_media_not_allowed"
    )


def test_allow_remote_media_defaults_to_false() -> None:
    """The tier setting's default is inline media only."""
    from gateway.config.settings import Settings

    assert all(not tier.allow_remote_media for tier in Settings().tiers.values())


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",  # link-local (metadata)
        "http://100.100.100.200/",  # shared 100.64/10 (metadata)
        "http://100.64.0.1/",  # shared 100.64/10
        "http://224.0.0.1/",  # multicast
        "http://240.0.0.1/",  # reserved
        "http://127.0.0.1/",  # loopback
        "http://10.0.0.5/",  # private
        "http://2130706433/",  # 127.0.0.1 as one number
        "http://0x7f000001/",  # in hex
        "http://0177.0.0.1/",  # in octal
        "http://[::ffff:10.0.0.5]/",  # IPv4-mapped
        "http://[64:ff9b::a00:5]/",  # NAT64
        "http://[2002:a00:5::]/",  # 6to4
        "http://[::ffff:0:a00:5]/",  # IPv4-translated
        "http://[2001:0:4136:e378:8000:63bf:f5ff:fffa]/",  # Teredo, client 10.0.0.5
        "http://[ff02::1]/",  # IPv6 multicast
        "http://[fe80::1]/",  # IPv6 link-local
    ],
)
async def test_non_global_addresses_are_media_url_forbidden(url: str) -> None:
    """Every address class and spelling in the list: 400 ``media_url_forbidden``."""
    assert await refusal(url) == "media_url_forbidden"


async def test_a_name_resolving_to_any_non_global_address_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every address a host resolves to is checked, not only the first."""

    async def resolve(*_args: Any, **_kwargs: Any) -> list[Any]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 80)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 80)),
        ]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", resolve)
    assert await refusal("http://cdn.example/x.png") == "media_url_forbidden"


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://93.184.215.14/x",
        "gopher://93.184.215.14/",
        "http://user:pw@93.184.215.14/x.png",  # user info
        "http://93.184.215.14\\@8.8.8.8/x.png",  # backslash
        "http://93.184.215.14/x\t.png",  # control character
        "http://93.184.215.14/x\x7f.png",
    ],
)
async def test_other_schemes_user_info_and_odd_characters_are_invalid(url: str) -> None:
    """400 ``invalid_media_url``, before any resolution."""
    assert await refusal(url) == "invalid_media_url"


async def test_a_host_that_does_not_resolve_is_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver error is 400 ``invalid_media_url``."""

    async def fail(*_args: Any, **_kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fail)
    assert await refusal("http://nowhere.invalid/x.png") == "invalid_media_url"


async def test_resolution_is_bounded_at_two_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver that never answers is cut at the 2 s bound (shortened here) and refused."""
    assert media._RESOLVE_TIMEOUT_S == 2.0
    monkeypatch.setattr(media, "_RESOLVE_TIMEOUT_S", 0.05)

    async def hang(*_args: Any, **_kwargs: Any) -> list[Any]:
        await asyncio.sleep(3600)
        return []

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", hang)
    assert await refusal("http://slow.example/x.png") == "invalid_media_url"
