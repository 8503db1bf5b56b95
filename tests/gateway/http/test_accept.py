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


class Reading(asyncio.Protocol):
    """Records the loop pass (see :func:`passes_to_read`) in which its first bytes came."""

    def __init__(self, passes: list[int], read: asyncio.Future[int]) -> None:
        self.passes, self.read = passes, read

    def data_received(self, data: bytes) -> None:
        if not self.read.done():
            self.read.set_result(self.passes[0])


async def passes_to_read() -> int:
    """Loop passes from a connection's accept to its first bytes read, for a client whose
    request is already queued when the listening socket is seen."""
    loop = asyncio.get_running_loop()
    passes = [0]
    accepted_in: list[int] = []
    read: asyncio.Future[int] = loop.create_future()

    def tick() -> None:  # runs once per pass of the loop
        passes[0] += 1
        if not read.done():
            loop.call_soon(tick)

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    acceptor = Acceptor(loop, listener, lambda: Reading(passes, read))
    accept_all = acceptor.accept_all
    loop.remove_reader(listener.fileno())

    def accept_and_mark() -> None:
        accepted_in.append(passes[0])
        accept_all()

    loop.add_reader(listener.fileno(), accept_and_mark)
    loop.call_soon(tick)
    await asyncio.sleep(0.01)
    client = socket.create_connection(listener.getsockname())
    client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    first_read = await asyncio.wait_for(read, timeout=5)
    client.close()
    acceptor.close()
    listener.close()
    return first_read - accepted_in[0]


def test_a_request_queued_with_its_connection_is_read_in_the_next_pass() -> None:
    """The serving coroutine starts in the accepting pass, so the transport exists at once and
    the request is read in the next pass (a task's first step would cost one more: under load
    each pass takes milliseconds, and that is a new stream's time to first token)."""
    assert uvloop.run(passes_to_read()) == 1
