"""The body the gateway forwards: what it writes into the caller's, and the prefix blocks.

Before a request is forwarded (gateway/http/proxy.py), the gateway asks for stream usage on the
caller's behalf (it settles token limits with it; the usage chunk is then hidden from a caller
who did not ask for it), bounds a missing ``max_tokens`` by the tiers' defaults, the key's cap
and what fits the tiers' context, writes the tenant's ``cache_salt`` (``requests.
prefix_cache_scope: tenant``: tenants never share a replica's prefix cache), and hashes the
prompt's prefix blocks where a replica choice reads them (the salt is part of the key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.upstream.forwarding import Forwarder
from policies.context_window import max_tokens_that_fit
from policies.prefix import PrefixConfig, prefix_blocks, tenant_cache_salt
from policies.requests import RequestSummary, default_max_tokens


def prepare_upstream(
    body: dict[str, Any],
    summary: RequestSummary,
    tiers: Sequence[str],
    key_cap: int | None,
    *,
    forwarder: Forwarder,
    prefix: PrefixConfig,
    tier_defaults: Mapping[str, int],
    salt_tenant: str | None = None,
) -> tuple[bool, tuple[int, ...]]:
    """The upstream body's own fields set, and its prefix blocks: whether the usage chunk
    must be hidden from the caller, and the blocks that choose a replica (none where no
    choice on ``tiers`` reads them: one replica, or a strategy without prefix affinity).

    ``tier_defaults``: per tier, the ``max_tokens`` written into a request that sets none.
    ``salt_tenant``: the tenant whose ``cache_salt`` is forwarded (``None``: the caller's).
    """
    strip_usage = _set_upstream_fields(
        body, summary, tiers, key_cap, forwarder=forwarder, tier_defaults=tier_defaults
    )
    if salt_tenant is not None:
        body["cache_salt"] = tenant_cache_salt(salt_tenant, body.get("cache_salt"))
    if not forwarder.uses_prefix(tiers):
        return strip_usage, ()
    return strip_usage, prefix_blocks(body, summary.kind, prefix)


def _set_upstream_fields(
    body: dict[str, Any],
    summary: RequestSummary,
    tiers: Sequence[str],
    key_cap: int | None,
    *,
    forwarder: Forwarder,
    tier_defaults: Mapping[str, int],
) -> bool:
    """Ask for stream usage (the gateway needs it) and bound a missing ``max_tokens``.

    Returns whether the usage chunk must be hidden from a caller who did not ask for it.
    """
    strip_usage = False
    if summary.stream and not summary.include_usage:
        options = body.get("stream_options") or {}
        body["stream_options"] = {**options, "include_usage": True}
        strip_usage = True
    if summary.max_tokens is None:
        defaults = [tier_defaults[tier] for tier in tiers]
        bound = default_max_tokens(defaults, key_cap, summary.kind, lowest=True)
        fits = max_tokens_that_fit(summary, tiers, tier_contexts(forwarder, tiers))
        body["max_tokens"] = bound if fits is None else min(bound, fits)
    return strip_usage


def tier_contexts(forwarder: Forwarder, tiers: Sequence[str]) -> dict[str, int | None]:
    """Each tier's context length, as its replicas reported it (``None``: unknown)."""
    routes = forwarder.routes
    return {tier: routes[tier].pool.context_len for tier in tiers}
