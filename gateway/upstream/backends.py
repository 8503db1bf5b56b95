"""Knowing what each replica is: its backend kind and the route its health is probed on.

A tier's ``kind`` (``auto`` by default) says which server its replicas run. For ``auto`` the
health monitor asks each replica a handful of cheap ``GET`` routes once — at start-up and
again after the replica was unreachable — and :func:`policies.backends.classify` names the
kind from the answers; the finding is logged (``backend.detected``) and shown in
``/admin/backends``. Then, for every kind, the probe route is the kind's first health route
that the server has, else ``/v1/models``: a reachable OpenAI-compatible server is never
marked dead only because it lacks ``/health``. A tier's ``health_path`` overrides the route
(and is then probed as given, even when it answers 404).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from gateway.upstream.replicas import Replica
from policies.backends import (
    DETECTION_PATHS,
    KINDS,
    MODELS_PATH,
    BackendKind,
    Probe,
    classify,
    identify,
    probe_path,
)

_log = structlog.get_logger("tiergate.backends")
# Enough for SGLang's /health (a one-token generation) on the first look at an unknown server.
DETECTION_TIMEOUT_S = max(kind.probe_timeout_s for kind in KINDS.values())
# Detections that may end "generic" only because some route did not answer in time (a LiteLLM
# proxy's first requests take seconds): after these, the generic finding stands.
DETECTION_TRIES = 3
_BODY_BYTES = 64 * 1024

# GET ``url`` within ``timeout_s``: the answer, ``Probe(None)`` when there was none.
Getter = Callable[[str, float], Awaitable[Probe]]


def kind_of(replica: Replica) -> BackendKind:
    """The kind the replica is treated as now (``openai`` until ``auto`` has found out)."""
    return KINDS[replica.kind or "openai"]


def probe_timeout(replica: Replica, base_s: float) -> float:
    """The health probe's timeout: the configured one, or more when the kind needs it."""
    return max(base_s, kind_of(replica).probe_timeout_s)


async def _ask(
    get: Getter, replica: Replica, paths: tuple[str, ...], timeout_s: float, known: dict[str, Probe]
) -> dict[str, Probe]:
    missing = [p for p in dict.fromkeys(paths) if p not in known]
    answers = await asyncio.gather(*(get(replica.url + p, timeout_s) for p in missing))
    return {**known, **dict(zip(missing, answers, strict=True))}


async def resolve(replica: Replica, get: Getter, base_timeout_s: float) -> None:
    """Settle ``replica.kind`` (detecting it for ``auto``) and ``replica.probe_path``.

    Leaves ``replica.resolved`` False when the server answered nothing, so the next round
    asks again.
    """
    probes: dict[str, Probe] = {}
    timeout_s = max(base_timeout_s, DETECTION_TIMEOUT_S)
    before = (replica.kind, replica.probe_path)
    if replica.kind_setting == "auto":
        probes = await _ask(get, replica, DETECTION_PATHS, timeout_s, probes)
        if identify(probes) is None and any(p.status is not None for p in probes.values()):
            probes = await _ask(get, replica, (MODELS_PATH,), timeout_s, probes)
        found = classify(probes)
        if found is None:
            return
        replica.kind, replica.detection = found.kind, found.evidence
        replica.detections += 1
        # A model list that did not answer in time (llama-cpp-python busy generating), or a
        # route that might have named the kind (a cold LiteLLM proxy), leaves a generic finding
        # provisional: use it now, look again next round.
        models = probes.get(MODELS_PATH)
        late = any(probes[p].status is None for p in DETECTION_PATHS)
        provisional = found.kind == "openai" and (
            models is None
            or models.status is None
            or (late and replica.detections < DETECTION_TRIES)
        )
    else:
        provisional = False
        replica.kind, replica.detection = replica.kind_setting, "configured"
    if replica.health_override is not None:
        replica.probe_path = replica.health_override
    else:
        kind = KINDS[replica.kind]
        probes = await _ask(get, replica, kind.health_paths, timeout_s, probes)
        if not any(probes[p].exists for p in kind.health_paths):
            probes = await _ask(get, replica, (MODELS_PATH,), timeout_s, probes)
        path = probe_path(kind, probes)
        if path is None:
            return
        replica.probe_path = path
    replica.resolved = not provisional
    if (replica.kind, replica.probe_path) == before and provisional:
        return  # the same provisional finding as last round: said already
    _log.info(
        "backend.detected",
        tier=replica.tier,
        replica=replica.name,
        kind=replica.kind,
        configured=replica.kind_setting,
        evidence=replica.detection,
        probe_path=replica.probe_path,
    )


def probe_would_queue(replica: Replica) -> bool:
    """Would a probe now wait behind a generation? Only on a one-at-a-time kind
    (llama-cpp-python) with requests in flight, and only for a route other than the kind's own
    health routes, which such a server answers at once (a ``health_path`` of ``/v1/models``,
    or detection not yet done, which may ask the model list). A replica that left those
    requests unanswered past its tier's timeouts is probed: hung, not busy."""
    kind = KINDS.get(replica.kind or "")
    if kind is None or not kind.serial or not replica.busy(time.monotonic()):
        return False
    return not replica.resolved or replica.health_path not in kind.health_paths


def forget(replica: Replica) -> None:
    """The replica became unreachable: an ``auto`` one is detected again when it is back."""
    if replica.kind_setting == "auto":
        replica.resolved = False
        replica.detections = 0
