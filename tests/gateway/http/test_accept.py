"""The gateway's acceptor takes every queued connection at once, even while the loop is busy."""

from __future__ import annotations

import asyncio
import socket
import time

import uvloop

from gateway.http.accept import Acceptor

CONNECTIONS = 300


class Counting(asyncio.Protocol):
    """Counts the connections it is given; sets ``everyone`` at the last one."""

    made = 0
    everyone: asyncio.Event

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Counting.made += 1
        if Counting.made == CONNECTIONS:
            Counting.everyone.set()


async def burst(accept_with_acceptor: bool) -> int:
    """Busy loop iterations (1 ms each) until a burst of connections is all accepted."""
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    port = listener.getsockname()[1]
    iterations = 0
    if not accept_with_acceptor:
        server = await loop.create_server(Counting, sock=listener, backlog=4096)

    def busy() -> None:  # one loop iteration's worth of other work, as open streams make
        nonlocal iterations
        iterations += 1
        until = time.perf_counter() + 0.001
        while time.perf_counter() < until:
            pass
        if not Counting.everyone.is_set():
            loop.call_soon(busy)

    acceptor = Acceptor(loop, listener, Counting) if accept_with_acceptor else None
    Counting.made = 0
    Counting.everyone = asyncio.Event()
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
    loop.call_soon(busy)
    await asyncio.wait_for(Counting.everyone.wait(), timeout=20)
    for client in clients:
        client.close()
    if acceptor is not None:
        acceptor.close()
        listener.close()
    else:
        server.close()
    assert Counting.made == CONNECTIONS
    return iterations


def test_a_burst_is_accepted_in_a_few_iterations_where_uvloop_takes_one_each() -> None:
    """300 queued connections: the acceptor needs a handful of loop iterations, uvloop's own
    server about one per connection (why issue 37's ramps waited in the kernel's queue)."""
    drained = uvloop.run(burst(accept_with_acceptor=True))
    one_by_one = uvloop.run(burst(accept_with_acceptor=False))
    assert drained <= 10
    assert one_by_one >= CONNECTIONS // 2
