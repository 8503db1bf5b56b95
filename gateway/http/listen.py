"""The listening socket: bound here, with one message for each reason it cannot be.

Stdlib only: the supervisor of ``serve --workers N`` binds before it starts its workers, and
importing the web stack first would delay every worker's start by as much.
"""

from __future__ import annotations

import errno
import socket


class ListenError(OSError):
    """The gateway cannot listen where it was told to (port in use, unknown address...)."""


def listen(host: str, port: int) -> socket.socket:
    """A bound socket for ``host:port``, or :class:`ListenError` saying why not."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ListenError(f"cannot listen on {where}: unknown address ({exc})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise ListenError(f"cannot listen on {where}: {reason}") from None
    return sock
