"""The gateway's full garbage collections: periodic, backing off while they find nothing."""

from __future__ import annotations

import asyncio
import gc

import pytest

from gateway.http import app


async def test_full_collections_back_off_while_they_find_nothing_and_not_while_they_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Waits double from 10 s up to 160 s while a collection finds no garbage, and go back
    to 10 s when one does."""
    found = iter([0, 0, 0, 0, 0, 3, 0])
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) > 7:
            raise asyncio.CancelledError

    monkeypatch.setattr(asyncio, "sleep", sleep)
    monkeypatch.setattr(gc, "collect", lambda: next(found))
    with pytest.raises(asyncio.CancelledError):
        await app._collect_garbage_periodically(10.0)
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, 160.0, 10.0, 20.0]
