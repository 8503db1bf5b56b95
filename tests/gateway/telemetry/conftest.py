"""Fixtures shared by the telemetry tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

_TOUCHED = ("aiohttp", "httpx", "uvicorn.access", "litestar", "uvicorn", "uvicorn.error")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put structlog and the standard library back as they were."""
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    saved = {
        name: (
            list(logging.getLogger(name).handlers),
            logging.getLogger(name).level,
            logging.getLogger(name).propagate,
        )
        for name in _TOUCHED
    }
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = saved_root[0]
    root.setLevel(saved_root[1])
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
