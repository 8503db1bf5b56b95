"""Fixtures shared by the upstream tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.upstream.pool import UpstreamPool


@pytest.fixture
async def client() -> AsyncIterator[UpstreamPool]:
    """The gateway's upstream client, for the monitor."""
    pool = UpstreamPool()
    try:
        yield pool
    finally:
        await pool.close()
