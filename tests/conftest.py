"""Session-wide test setup: structlog events go through the standard library, not raw stdout.

Without this, events logged by in-process apps from background tasks (the health monitor
between two tests) are printed by structlog's default PrintLogger straight into pytest's
progress output. Routed through ``logging``, pytest captures them per test ("Captured log")
and nothing is printed between tests. Tests that configure logging themselves
(tests/gateway/telemetry/test_logging.py) still do, and reset it afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import pytest
import structlog

from gateway.upstream.attempt import UpstreamClient
from tests import run_order, shared_data


def _route_structlog_to_logging() -> None:
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.KeyValueRenderer(key_order=["event"]),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
    )


def pytest_configure(config: pytest.Config) -> None:
    """Before any fixture: route structlog to logging, and never print unhandled records."""
    _route_structlog_to_logging()
    logging.getLogger().addHandler(logging.NullHandler())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first (the order otherwise kept): with several workers, a long
    test started last would leave the others idle at the end of the run. Under
    ``--dist worksteal`` (``make test-all``) each worker's first chunk instead starts with
    its share of the expensive modules (tests/run_order.py)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1 and config.getoption("dist", None) == "worksteal":
        items[:] = run_order.balanced(items, workers, run_order.load_durations())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before fixtures: a test that reads a missing ``../shared`` file skips (fails in CI)."""
    shared_data.check(item)


@pytest.fixture(autouse=True)
def _structlog_through_logging() -> Iterator[None]:
    """Again before each test: a test may have reset structlog to its defaults.

    After it, a configuration that caches loggers on first use (what ``configure_logging``
    sets, e.g. a test running ``server._run`` in process) is dropped: left behind, the next
    first use of a module's logger would freeze its processors, and a later test's
    ``capture_logs`` would see nothing from it.
    """
    _route_structlog_to_logging()
    yield
    if structlog.get_config()["cache_logger_on_first_use"]:
        structlog.reset_defaults()
    _route_structlog_to_logging()


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamClient]:
    """The gateway's upstream client (the request path's pool and the probes' pool), open."""
    client = UpstreamClient()
    client.open()
    try:
        yield client
    finally:
        await client.close()
