"""``GET /admin/backends`` (every replica's state) and ``GET /admin/queue`` (each tier's queue:
who waited longest, who was refused most), behind the admin credential.

The route is registered only when an admin token is configured (otherwise the path is a 404
like any unknown one). The caller sends ``Authorization: Bearer <admin token>``, checked in
constant time by the key admin API's :class:`AdminGuard`; the token never appears in a log
line or an error body. Replicas are shown by host:port, without any user-info in their URLs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import Request, Response, get

from gateway.access.admin_keys import AdminGuard, authorization
from gateway.upstream.backends import kind_of
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.replicas import Replica

_encoder = msgspec.json.Encoder()


def _hit_rate(replica: Replica) -> float | None:
    if replica.prefix_queries <= 0:
        rate = replica.prefix_hit_rate  # a server that reports only a rate (SGLang)
        return None if rate is None else round(rate, 4)
    return round(replica.prefix_hits / replica.prefix_queries, 4)


def backend_view(replica: Replica) -> dict[str, Any]:
    """What the gateway knows about the server behind a replica."""
    kind = kind_of(replica)
    return {
        "configured": replica.kind_setting,
        "kind": replica.kind,
        "detection": replica.detection or None,
        "probe_path": replica.health_path,
        "metrics_path": kind.metrics_path if kind.metrics else None,
        "stream_usage": kind.stream_usage,
        "request_ids": "uuid" if kind.uuid_request_ids else "any",
        "error_shape": kind.error_shape,
        "max_model_len": replica.max_model_len,
        "sleep_state": replica.sleep_state,
    }


def replica_view(replica: Replica, now: float, wall: float) -> dict[str, Any]:
    """One replica as the admin view shows it."""
    return {
        "replica": replica.name,
        "label": replica.label,  # what callers' error messages call it
        "state": replica.state(now),
        "healthy": replica.healthy,
        "misconfigured": replica.misconfigured,
        "backend": backend_view(replica),
        "ejected_for_s": round(max(0.0, replica.ejected_until - now), 3),
        "cooldown_for_s": round(max(0.0, replica.cooldown_until - now), 3),
        "in_flight": replica.in_flight,
        "max_concurrency": replica.max_concurrency,
        "slots": replica.slots,
        "engine_slots": replica.engine_slots,
        "waiting_capacity": replica.waiting_capacity,
        "drain_per_s": round(replica.drain_per_s, 3),
        "running": replica.running,
        "waiting": replica.waiting,
        "kv_usage": replica.kv_usage,
        "prefix_cache_hit_rate": _hit_rate(replica),
        "ms_per_token": round(replica.token_s * 1000, 3) if replica.token_s > 0 else None,
        "consecutive_failures": replica.consecutive_failures,
        "ejections_total": replica.ejections_total,
        "last_check_s_ago": round(now - replica.last_check_at, 3) if replica.checked else None,
        "attempts": dict(replica.outcomes),
        "truncated_streams": dict(replica.truncated),
        "recent_errors": [
            {"age_s": round(wall - e.at, 3), "kind": e.kind, "message": e.message}
            for e in reversed(replica.recent_errors)
        ],
    }


def backends_body(routes: Mapping[str, TierRoute], forwarder: Forwarder) -> bytes:
    """The whole ``/admin/backends`` document."""
    now, wall = time.monotonic(), time.time()
    tiers = {}
    for tier, route in routes.items():
        pool = route.pool
        tiers[tier] = {
            "strategy": route.strategy.name,
            "affinity": {
                name: getattr(route.strategy, name)
                for name in ("affinity_hits", "load_fallbacks")
                if hasattr(route.strategy, name)
            },
            "retries": dict(pool.retries),
            "shed": pool.shed,
            "max_model_len": pool.context_len,  # what the context pre-check uses
            "replicas": [replica_view(r, now, wall) for r in pool.replicas],
        }
    budget = forwarder.budget
    return _encoder.encode(
        {
            "tiers": tiers,
            "retry_budget": {
                "in_flight": budget.in_flight,
                "retrying": budget.retrying,
                "refused": budget.refused,
            },
        }
    )


def queue_body(routes: Mapping[str, TierRoute]) -> bytes:
    """The whole ``/admin/queue`` document: per tier, its queue now and its top tenants."""
    tiers = {}
    for tier, route in routes.items():
        pool = route.pool
        stats = pool.queue_stats
        tiers[tier] = {
            "policy": pool.queue.policy,
            "waiting": pool.queue.waiting,
            "max_length": pool.queue.max_length,
            "max_wait_s": pool.class_waits,
            "retry_after_s": pool.retry_after(),
            "shed": {f"{p}/{reason}": n for (p, reason), n in stats.shed.items()},
            "top_tenants": stats.top(),
        }
    return _encoder.encode({"tiers": tiers})


def admin_backends_handlers(forwarder: Forwarder, admin_token: str | None) -> list[Any]:
    """The route handler bound to this app's forwarder, or none when admin is off."""
    if not admin_token:
        return []
    guard = AdminGuard(admin_token)

    @get("/admin/backends", sync_to_thread=False)
    def admin_backends(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        body = backends_body(forwarder.routes, forwarder)
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    @get("/admin/queue", sync_to_thread=False)
    def admin_queue(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        body = queue_body(forwarder.routes)
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    return [admin_backends, admin_queue]
