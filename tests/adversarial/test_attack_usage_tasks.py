"""Hostile tests of the usage report's read (34fb553) and of stop_tasks' detached finisher
(a1e08df), against a real redis-server and real sockets.

Each test failed on the code of those commits and holds with the fixes on this branch.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient

from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings, Settings
from gateway.limits.usage import FIELDS, RedisUsageStore, UsageLedger, admin_usage_handlers
from gateway.pipeline.errors import EXCEPTION_HANDLERS
from gateway.routing.accounting import cost_model
from tests.processes import free_port, patience
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

ROW = ("fast", "acme", "k1")


class _HeldAnswers:
    """A TCP proxy to Redis that holds back the answer to the n-th transaction (a write that
    opens with MULTI) for ``delays[n]`` seconds; everything else passes at once. The read then
    reaches Redis on time and its answer comes back late, per report."""

    def __init__(self, redis_port: int, delays: list[float]) -> None:
        self.redis_port = redis_port
        self.delays = list(delays)
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        hold: list[float] = []

        async def up() -> None:
            while data := await reader.read(65536):
                if b"MULTI" in data:
                    hold.append(self.delays.pop(0) if self.delays else 0.0)
                up_writer.write(data)

        async def down() -> None:
            while data := await up_reader.read(65536):
                if hold:
                    await asyncio.sleep(hold.pop(0))
                writer.write(data)

        try:
            await asyncio.gather(up(), down())
        except OSError:
            pass
        finally:
            writer.close()
            up_writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


async def _requests(store: RedisUsageStore) -> float:
    rows = await store.rows(range(5, 6))
    return rows.get(ROW, [0.0] * len(FIELDS))[0]


async def test_overlapping_reports_each_keep_their_own_record_of_batches(
    redis_server: RedisServer,
) -> None:
    """Report B's read reaches Redis before a batch and is answered after it; report A starts
    later and ends first. Each must drop its own record of batches confirmed meanwhile: the
    first version removed the first *equal* list (``list.remove``, and every empty list is
    equal), so A took B's record away, B missed the batch (reported 0 of 3), a third report C
    then failed with ValueError, and A's record stayed in the store, filling with every batch
    confirmed from then on."""
    proxy = _HeldAnswers(redis_server.port, delays=[0.6, 0.0, 0.6])  # B, A, C
    client = open_redis(RedisSettings(url=await proxy.start(), socket_timeout_s=5))
    try:
        store = RedisUsageStore(client, "u:")
        store.add(5, ROW, (3.0,) * len(FIELDS))
        report_b = asyncio.create_task(_requests(store))
        await asyncio.sleep(0.1)  # B's read has reached Redis (nothing counted there yet)
        assert await _requests(store) == 3.0  # A: from memory, done before B
        await store.flush()  # counted by Redis after B's read, confirmed before B's answer
        report_c = asyncio.create_task(_requests(store))
        await asyncio.sleep(0.1)
        results = await asyncio.gather(report_b, report_c, return_exceptions=True)
        assert list(results) == [3.0, 3.0]
        assert not store._readers
        assert await _requests(store) == 3.0
    finally:
        await client.aclose()
        await proxy.stop()


async def test_the_usage_report_during_a_redis_outage_is_a_503() -> None:
    """``GET /admin/usage`` while the shared store is out of reach: an OpenAI-shaped 503 that
    names the store, as the dial's admin route does (``dial_store_unavailable``), not the
    catch-all 500 ``internal_error`` with a traceback logged as a gateway bug."""
    settings = Settings()
    client = open_redis(
        RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.2)
    )
    ledger = UsageLedger(
        cost_model(settings.tiers, settings.router.precise_tier), RedisUsageStore(client, "u:")
    )
    app = Litestar(
        route_handlers=admin_usage_handlers(ledger, "admin-secret-0123456789"),
        exception_handlers=EXCEPTION_HANDLERS,
    )
    try:
        async with AsyncTestClient(app=app) as http:
            answer = await http.get(
                "/admin/usage?window=1h",
                headers={"Authorization": "Bearer admin-secret-0123456789"},
            )
    finally:
        await client.aclose()
    assert answer.status_code == 503, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "usage_store_unavailable"
    assert error["type"] == "server_error"


_LOOP_ENDS = textwrap.dedent(
    """
    import asyncio
    from gateway.pipeline.tasks import stop_tasks

    async def loses_cancellations():  # as redis-py's wait_for can, twice here
        lost = 0
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                lost += 1
                if lost > 2:
                    raise

    async def main():
        polling = asyncio.create_task(loses_cancellations())
        await asyncio.sleep(0.02)
        stopping = asyncio.create_task(stop_tasks(polling, within_s=2.0))
        await asyncio.sleep(0.001)  # one ask made, the next 50 ms away
        stopping.cancel()  # the shutdown's caller is cancelled, and the program ends

    asyncio.run(main())
    print("ended")
    """
)


def test_a_stop_cancelled_as_the_loop_ends_still_ends_its_tasks() -> None:
    """The caller of ``stop_tasks`` is cancelled and the event loop shuts down at once
    (``asyncio.run`` returning, as a cancelled main task does): ``asyncio.run`` cancels every
    task once, the finisher included, before the finisher has taken its first step, so it
    never asks, the polling task outlives the one cancel it gets, and ``asyncio.run`` waits
    for it forever (the first version hung here)."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOOP_ENDS],
        capture_output=True,
        text=True,
        timeout=patience(20.0),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ended"
    assert "destroyed but it is pending" not in proc.stderr
