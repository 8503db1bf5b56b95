"""One factory for a test's world: N simulators, an optional redis-server, a gateway in front.

    @pytest.fixture(scope="module")
    def stack() -> Iterator[Stack]:
        with running_stack(configure=_media_rules) as stack:
            yield stack

``sims`` takes one argument list per simulator (default: a zero-latency fast and precise one).
The default configuration puts the first simulator behind the fast tier and the last behind
the precise tier, with auth off and no access log; ``configure`` edits it in place once the
simulators (and Redis) listen, before the gateway starts. Every process is stopped on exit,
in the reverse order of its start. ``gateway_type=ForkedGateway``
(tests/integration/forked_gateway.py) forks the gateway from a pre-imported fork server
instead of starting ``python -m gateway``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

FAST_SIM = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0")
PRECISE_SIM = ("--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "0")
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Backends:
    """What listens before the gateway starts: the simulators in order, Redis if asked for."""

    sims: tuple[SimulatorProcess, ...]
    redis: RedisServer | None = None

    @property
    def fast(self) -> SimulatorProcess:
        """The first simulator: the fast tier's by default."""
        return self.sims[0]

    @property
    def precise(self) -> SimulatorProcess:
        """The last simulator: the precise tier's by default (the fast one when alone)."""
        return self.sims[-1]

    @property
    def redis_url(self) -> str:
        """The redis-server's URL (a test that asks for it started one)."""
        if self.redis is None:
            raise RuntimeError("this stack runs without Redis: running_stack(redis=True)")
        return self.redis.url


@dataclass(frozen=True, kw_only=True)
class Stack(Backends):
    """The running world: the backends and the gateway in front of them."""

    gateway: GatewayProcess

    def post(
        self,
        body: dict[str, Any],
        path: str = CHAT_PATH,
        *,
        key: str | None = None,
        timeout: float = 10.0,
    ) -> httpx.Response:
        """POST ``body`` as JSON to the gateway, with ``key`` as the bearer token if given."""
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        return httpx.post(self.gateway.url + path, json=body, headers=headers, timeout=timeout)


Configure = Callable[[dict[str, Any], Backends], None]


def default_config(backends: Backends) -> dict[str, Any]:
    """Fast tier on the first simulator, precise on the last; auth off, no access log."""
    return {
        "auth": {"enabled": False},
        "tiers": tiers_config([backends.fast.url], [backends.precise.url]),
        "telemetry": {"access_log": False},
    }


@contextmanager
def running_stack(
    *,
    sims: Sequence[Sequence[str]] = (FAST_SIM, PRECISE_SIM),
    redis: bool = False,
    configure: Configure | None = None,
    workers: int = 1,
    env: dict[str, str] | None = None,
    gateway_type: type[GatewayProcess] = GatewayProcess,
) -> Iterator[Stack]:
    """Start Redis (if ``redis``), the simulators, then the gateway (with ``env`` added to its
    environment); stop them all on exit."""
    with ExitStack() as running:
        server = running.enter_context(RedisServer()) if redis else None
        procs = tuple(running.enter_context(SimulatorProcess(*args)) for args in sims)
        backends = Backends(procs, server)
        config = default_config(backends)
        if configure is not None:
            configure(config, backends)
        gateway = running.enter_context(gateway_type(config, workers=workers, env=env))
        yield Stack(sims=procs, redis=server, gateway=gateway)


@contextmanager
def running_backends(
    *, sims: Sequence[Sequence[str]] = (FAST_SIM, PRECISE_SIM), redis: bool = False
) -> Iterator[Backends]:
    """Only the backends of ``running_stack``, for a module to share among several gateways
    (``gateway_in_front``); stopped on exit, in the reverse order of their start."""
    with ExitStack() as running:
        server = running.enter_context(RedisServer()) if redis else None
        procs = tuple(running.enter_context(SimulatorProcess(*args)) for args in sims)
        yield Backends(procs, server)


@contextmanager
def gateway_in_front(
    backends: Backends,
    *,
    configure: Configure | None = None,
    workers: int = 1,
    env: dict[str, str] | None = None,
    gateway_type: type[GatewayProcess] = GatewayProcess,
) -> Iterator[Stack]:
    """``running_stack``'s gateway (the same default config, edited by ``configure``) in front
    of backends already running; only the gateway is stopped on exit. ``gateway_type`` as in
    ``running_stack``."""
    config = default_config(backends)
    if configure is not None:
        configure(config, backends)
    with gateway_type(config, workers=workers, env=env) as gateway:
        yield Stack(sims=backends.sims, redis=backends.redis, gateway=gateway)
