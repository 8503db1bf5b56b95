"""Resolving the hosts of remote media URLs before a backend is asked to fetch them.

The backend (vLLM) fetches ``image_url`` and friends itself, from inside the inference
network: a URL naming a metadata service, a loopback or a private address would make it a
confused deputy (SSRF). ``policies/fields.py`` refuses literal addresses; this resolves host
names and refuses any that resolve to a non-global address. A host that cannot be resolved in
time is refused too. (The backend resolves again when it fetches: keep remote media off on
tiers whose network can reach anything sensitive, which is the default.)
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from policies.errors import InvalidRequest
from policies.fields import MediaUrl, check_address, remote_host

_RESOLVE_TIMEOUT_S = 2.0


async def check_media(urls: Sequence[MediaUrl], *, remote_allowed: bool) -> None:
    """Raise :class:`InvalidRequest` unless every URL is inline or points at public hosts."""
    loop = asyncio.get_running_loop()
    for media in urls:
        target = remote_host(media, remote_allowed=remote_allowed)
        if target is None:
            continue
        host, port = target
        try:
            async with asyncio.timeout(_RESOLVE_TIMEOUT_S):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError, UnicodeError):
            raise InvalidRequest(
                f"'{media.param}': the URL's host could not be resolved.",
                param=media.param,
                code="invalid_media_url",
            ) from None
        for info in infos:
            check_address(media, str(info[4][0]))
