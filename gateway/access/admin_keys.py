"""The key admin API under ``/admin/keys``: list, create, revoke, rotate.

Registered only when an admin token is configured (``auth.admin_token`` or
``auth.admin_token_file``). Callers present it as ``Authorization: Bearer <admin token>``; it is
compared in constant time. API keys are a different credential: presenting one here gets 403,
anything else 401. Created and rotated keys are returned once, in the response body only.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, delete, get, post
from litestar.params import FromPath

from gateway.config.settings import MIN_ADMIN_TOKEN_CHARS
from policies.errors import AuthenticationFailed, InvalidRequest, PermissionDenied
from policies.keys import (
    KEY_PREFIX,
    KeyRecord,
    KeyStore,
    PolicyError,
    bearer_token,
    check_owner,
    create_key,
    describe,
    make_policy,
    revoke_key,
    rotate_stored_key,
    valid_key_id,
)
from policies.principal import KeyPolicy

_encoder = msgspec.json.Encoder()


class NewKey(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/keys`` body."""

    tenant: str
    name: str = ""
    tiers: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_tokens: int | None = None
    concurrency: int | None = None
    max_n: int | None = None
    expires_in_days: float | None = None
    scopes: list[str] = msgspec.field(default_factory=list)
    rules: list[str] = msgspec.field(default_factory=list)  # routing rule overrides, NAME:on|off
    budget_daily: float | None = None
    budget_monthly: float | None = None
    max_precise_share: float | None = None
    precise_share_over: str | None = None
    priority: str | None = None  # queue class when a tier is full: interactive or batch
    queue_weight: float | None = None  # its weight among the tenants waiting in that class


class KeyNotFound(InvalidRequest):
    """No key has this id (404)."""

    status = 404
    default_code = "key_not_found"


def _json(data: Any, status: int = 200) -> Response[bytes]:
    return Response(
        _encoder.encode(data),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def authorization(request: Request[Any, Any, Any]) -> str | None:
    """The request's Authorization as the edge reads it (``gateway.http.edge.header_view``):
    repeated lines joined with ", ", which no credential matches, so that a proxy checking one
    line and the gateway checking another cannot disagree on who is calling."""
    values = request.headers.getall("authorization", [])
    return ", ".join(values) if values else None


class AdminGuard:
    """Checks the admin credential in constant time."""

    def __init__(self, token: str) -> None:
        if len(token) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"the admin token must have at least {MIN_ADMIN_TOKEN_CHARS} characters"
            )
        self._token = token.encode("utf-8")

    def check(self, authorization: str | None) -> None:
        """Raise 401/403 unless the header carries the admin token."""
        presented = bearer_token(authorization, admin=True).encode("utf-8")
        if hmac.compare_digest(presented, self._token):
            return
        if presented.startswith(KEY_PREFIX.encode() + b"-"):
            raise PermissionDenied("API keys cannot use the admin API.", code="admin_required")
        raise AuthenticationFailed("Invalid admin token.", code="invalid_admin_token")


def _checked_id(key_id: str) -> str:
    if not valid_key_id(key_id):
        raise KeyNotFound("No key has this id.", param="key_id")
    return key_id


async def _requested(
    request: Request[Any, Any, Any], tiers: tuple[str, ...], clock: Callable[[], float]
) -> tuple[NewKey, KeyPolicy, float]:
    """The key asked for in ``request``'s body, its checked policy and the time it was made.

    A body that is not a valid key request, or a policy that does not hold, is a 400.
    """
    try:
        spec = msgspec.json.decode(await request.body(), type=NewKey)
        check_owner(spec.tenant, spec.name)
        now = clock()
        policy = make_policy(
            tiers=spec.tiers,
            rpm=spec.rpm,
            tpm=spec.tpm,
            max_tokens=spec.max_tokens,
            concurrency=spec.concurrency,
            expires_in_days=spec.expires_in_days,
            scopes=spec.scopes,
            max_n=spec.max_n,
            max_precise_share=spec.max_precise_share,
            precise_share_over=spec.precise_share_over,
            now=now,
            known_tiers=tiers,
            budget_daily=spec.budget_daily,
            budget_monthly=spec.budget_monthly,
            rules=spec.rules,
            priority=spec.priority,
            queue_weight=spec.queue_weight,
        )
    except PolicyError as exc:
        raise InvalidRequest(f"Invalid key request: {exc}", param=exc.param) from None
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        raise InvalidRequest(f"Invalid key request: {exc}") from None
    return spec, policy, now


async def _revoked(store: KeyStore, key_id: str) -> KeyRecord:
    """The key ``key_id``, revoked; an unknown id is a 404."""
    record = await revoke_key(store, _checked_id(key_id))
    if record is None:
        raise KeyNotFound("No key has this id.", param="key_id")
    return record


async def _rotated(store: KeyStore, key_id: str, pepper: bytes | None) -> tuple[KeyRecord, str]:
    """The key ``key_id`` with a new secret, and that secret; unknown: 404, revoked: 400."""
    try:
        result = await rotate_stored_key(store, _checked_id(key_id), pepper)
    except ValueError as exc:
        raise InvalidRequest(str(exc), code="key_revoked") from None
    if result is None:
        raise KeyNotFound("No key has this id.", param="key_id")
    return result


_audit = structlog.get_logger("tiergate.audit")


def _log_change(action: str, record: KeyRecord) -> None:
    """The audit event of a key created, revoked or rotated through the API (its id and tenant;
    never its secret or digest)."""
    _audit.info(
        "keys.changed",
        audit=True,
        actor="admin",
        action=action,
        key_id=record.key_id,
        tenant=record.tenant,
    )


def admin_key_handlers(
    store: KeyStore,
    token: str,
    *,
    tiers: tuple[str, ...],
    pepper: bytes | None = None,
    clock: Callable[[], float] = time.time,
    on_change: Callable[[str], None] | None = None,
) -> list[Any]:
    """Route handlers for ``/admin/keys`` guarded by ``token``.

    ``on_change(key_id)`` runs after every stored change, before the answer is sent (the
    authenticator drops the id from its cache, so the change applies here at once).
    """
    guard = AdminGuard(token)

    def changed(key_id: str) -> None:
        if on_change is not None:
            on_change(key_id)

    @get("/admin/keys")
    async def list_keys(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        now = clock()
        data = [describe(r, now) for r in await store.all()]
        data += [entry.describe() for entry in await store.damaged()]
        return _json({"object": "list", "data": data})

    @post("/admin/keys", status_code=201)
    async def create(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        spec, policy, now = await _requested(request, tiers, clock)
        record, key = await create_key(
            store, spec.tenant, policy, now=now, name=spec.name, pepper=pepper
        )
        changed(record.key_id)
        _log_change("create", record)
        return _json({**describe(record, now), "key": key}, status=201)

    @delete("/admin/keys/{key_id:str}", status_code=200)
    async def revoke(request: Request[Any, Any, Any], key_id: FromPath[str]) -> Response[bytes]:
        guard.check(authorization(request))
        record = await _revoked(store, key_id)
        changed(record.key_id)
        _log_change("revoke", record)
        return _json(describe(record, clock()))

    @post("/admin/keys/{key_id:str}/rotate", status_code=200)
    async def rotate(request: Request[Any, Any, Any], key_id: FromPath[str]) -> Response[bytes]:
        guard.check(authorization(request))
        record, key = await _rotated(store, key_id, pepper)
        changed(record.key_id)
        _log_change("rotate", record)
        return _json({**describe(record, clock()), "key": key})

    return [list_keys, create, revoke, rotate]
