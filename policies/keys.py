"""API keys: format, digests, records with their policy, and the key-store port.

A key reads ``tg-<key_id>-<secret>``. The id (10 lowercase letters/digits) is safe to log and
is how a record is found; the secret (43 base62 characters, about 256 bits) is shown once at
creation and never stored: a record keeps only a digest of the whole key, SHA-256 or, with a
server-side pepper, HMAC-SHA-256. Verification compares digests in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import string
from dataclasses import dataclass, replace
from typing import Any, Protocol

from policies.errors import AuthenticationFailed, TierGateError
from policies.principal import (
    SCOPE_DOWNGRADE,
    SCOPE_ENGINE_FIELDS,
    SCOPE_PRIORITY,
    SCOPE_ROUTE_OVERRIDE,
    KeyPolicy,
    Principal,
)
from policies.tiering import check_rule_overrides

KEY_PREFIX = "tg"
KNOWN_SCOPES = frozenset(
    {SCOPE_ROUTE_OVERRIDE, SCOPE_DOWNGRADE, SCOPE_ENGINE_FIELDS, SCOPE_PRIORITY}
)
_DAY_S = 86400.0
MAX_EXPIRY_DAYS = 3650  # ten years: a longer-lived key is a key that should not expire
# Limits are applied in doubles (Redis Lua): anything above 2**53 is no longer exact.
MAX_LIMIT = 2**53
# A tenant and a key name go into every access-log line, Redis key and report of the key's
# requests: bounded, and printable (no newline or terminal escape in a console log).
MAX_OWNER_CHARS = 200
_ID_ALPHABET = string.ascii_lowercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits
_ID_LENGTH = 10
_SECRET_LENGTH = 43
_ID_PATTERN = re.compile(r"[a-z0-9_]{1,64}")
# tg-<id>-<secret>: the secret is 16-256 printable ASCII characters (we issue 43 base62 ones).
_KEY_PATTERN = re.compile(KEY_PREFIX + r"-([a-z0-9_]{1,64})-[\x21-\x7e]{16,256}")


class PolicyError(ValueError):
    """A key policy option is invalid; ``param`` names the option (safe to echo)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class KeyStoreUnavailable(TierGateError):
    """The key store cannot be reached and the key is not in the local cache (503)."""

    status = 503
    error_type = "server_error"
    default_code = "auth_unavailable"


def bearer_token(authorization: str | None, *, admin: bool = False) -> str:
    """The token of a ``Bearer`` header; raises 401 (never quoting the header).

    ``admin``: the header is expected to carry the admin token, and the errors say so.
    """
    if not authorization:
        if admin:
            raise AuthenticationFailed(
                "You didn't provide the admin token. Send it as "
                "'Authorization: Bearer <admin token>'.",
                code="missing_admin_token",
            )
        raise AuthenticationFailed(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            code="missing_api_key",
        )
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        if admin:
            raise AuthenticationFailed(
                "The Authorization header must read 'Bearer <admin token>'.",
                code="invalid_admin_token",
            )
        raise AuthenticationFailed(
            "The Authorization header must read 'Bearer <key>'.", code="invalid_api_key"
        )
    return token.strip()


def new_key_id() -> str:
    """A short random id, safe to log."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))


def _new_secret() -> str:
    return "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(_SECRET_LENGTH))


def valid_key_id(key_id: str) -> bool:
    """True for a syntactically valid key id (lowercase letters, digits, ``_``)."""
    return _ID_PATTERN.fullmatch(key_id) is not None


def parse_key(token: str) -> str | None:
    """The key id of a well-formed key, else ``None``. Never echo ``token`` anywhere."""
    match = _KEY_PATTERN.fullmatch(token)
    return match.group(1) if match is not None else None


def key_digest(token: str, pepper: bytes | None = None) -> str:
    """The stored form of a key: ``sha256:<hex>`` or, with a pepper, ``hmac-sha256:<hex>``."""
    data = token.encode("utf-8")
    if pepper:
        return "hmac-sha256:" + hmac.new(pepper, data, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def policy_to_dict(policy: KeyPolicy) -> dict[str, Any]:
    """A plain mapping (YAML/JSON) of a key policy."""
    return {
        "tiers": sorted(policy.allowed_tiers) if policy.allowed_tiers is not None else None,
        "rpm": policy.rpm,
        "tpm": policy.tpm,
        "max_tokens": policy.max_tokens,
        "concurrency": policy.max_concurrency,
        "expires_at": policy.expires_at,
        "scopes": sorted(policy.scopes),
        "budget_daily": policy.budget_daily,
        "budget_monthly": policy.budget_monthly,
    } | _newer_fields(policy)


def _newer_fields(policy: KeyPolicy) -> dict[str, Any]:
    """Fields written only when set: gateways older than them refuse unknown fields."""
    fields: dict[str, Any] = {}
    if policy.max_n != 1:
        fields["max_n"] = policy.max_n
    if policy.max_precise_share is not None:
        fields["max_precise_share"] = policy.max_precise_share
        fields["precise_share_over"] = policy.precise_share_over
    if policy.rules:
        fields["rules"] = sorted(policy.rules)
    if policy.priority != "interactive":
        fields["priority"] = policy.priority
    if policy.queue_weight != 1.0:
        fields["queue_weight"] = policy.queue_weight
    return fields


def _queue_place(data: dict[str, Any]) -> tuple[str, float]:
    priority = data.get("priority") or "interactive"
    if priority not in ("interactive", "batch"):
        raise PolicyError(
            "policy field 'priority' must be 'interactive' or 'batch'", param="priority"
        )
    weight = data.get("queue_weight")
    if weight is None:
        return priority, 1.0
    # Bounded below too: 1/weight advances the queue's clock, and a vanishing weight (1e-300)
    # would push it where adding 1 is lost and fair queuing turns into arrival order.
    number = isinstance(weight, int | float) and not isinstance(weight, bool)
    if not number or not 0.001 <= weight <= 1000:
        raise PolicyError(
            "policy field 'queue_weight' must be a number from 0.001 to 1000 or null",
            param="queue_weight",
        )
    return priority, float(weight)


def _share(data: dict[str, Any]) -> tuple[float | None, str]:
    value, over = data.get("max_precise_share"), data.get("precise_share_over") or "downgrade"
    if over not in ("downgrade", "refuse"):
        raise PolicyError(
            "policy field 'precise_share_over' must be 'downgrade' or 'refuse'",
            param="precise_share_over",
        )
    if value is None:
        return None, over
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise PolicyError(
            "policy field 'max_precise_share' must be a number from 0 to 1 or null",
            param="max_precise_share",
        )
    return float(value), over


def _budget(data: dict[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < 1e15):
        raise ValueError(f"policy field {name!r} must be a positive number or null")
    return float(value)


def _positive(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise PolicyError(
            f"policy field {name!r} must be an integer from 1 to {MAX_LIMIT} or null", param=name
        )
    return value


def _names(data: dict[str, Any], name: str) -> frozenset[str] | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"policy field {name!r} must be a list of names", param=name)
    return frozenset(value)


def policy_from_dict(data: dict[str, Any]) -> KeyPolicy:
    """Parse and check a key policy mapping."""
    unknown = set(data) - {
        "tiers",
        "rpm",
        "tpm",
        "max_tokens",
        "concurrency",
        "expires_at",
        "scopes",
        "budget_daily",
        "budget_monthly",
        "max_n",
        "rules",
        "max_precise_share",
        "precise_share_over",
        "priority",
        "queue_weight",
    }
    if unknown:
        raise ValueError(f"unknown policy fields: {sorted(unknown)}")
    expires = data.get("expires_at")
    if expires is not None and (
        isinstance(expires, bool)
        or not isinstance(expires, int | float)
        or not math.isfinite(expires)
        or expires < 0
    ):
        raise PolicyError(
            "policy field 'expires_at' must be finite epoch seconds or null", param="expires_at"
        )
    tiers = _names(data, "tiers")
    if tiers is not None and not tiers:
        raise PolicyError(
            "policy field 'tiers' must name at least one tier (or be null: all)", param="tiers"
        )
    share, over = _share(data)
    priority, weight = _queue_place(data)
    return KeyPolicy(
        allowed_tiers=tiers,
        rpm=_positive(data, "rpm"),
        tpm=_positive(data, "tpm"),
        max_tokens=_positive(data, "max_tokens"),
        max_concurrency=_positive(data, "concurrency"),
        expires_at=float(expires) if expires is not None else None,
        scopes=_names(data, "scopes") or frozenset(),
        budget_daily=_budget(data, "budget_daily"),
        budget_monthly=_budget(data, "budget_monthly"),
        max_n=_positive(data, "max_n") or 1,  # absent (older records): one completion
        rules=_rules(data),
        max_precise_share=share,
        precise_share_over=over,
        priority=priority,
        queue_weight=weight,
    )


def _rules(data: dict[str, Any]) -> frozenset[str]:
    rules = _names(data, "rules") or frozenset()
    try:
        check_rule_overrides(rules)
    except ValueError as exc:
        raise PolicyError(str(exc), param="rules") from None
    return rules


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What a key store keeps about one key: never the key itself."""

    key_id: str
    tenant: str
    digest: str
    policy: KeyPolicy
    created_at: float
    name: str = ""
    disabled: bool = False

    def matches(self, token: str, pepper: bytes | None) -> bool:
        """Constant-time check that ``token`` is this record's key."""
        return hmac.compare_digest(key_digest(token, pepper), self.digest)

    def usable(self, now: float) -> bool:
        """Neither disabled nor expired at ``now`` (epoch seconds)."""
        expires = self.policy.expires_at
        return not self.disabled and (expires is None or now < expires)

    def principal(self) -> Principal:
        """The principal this key authenticates as."""
        return Principal(key_id=self.key_id, tenant=self.tenant, policy=self.policy)

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping for the YAML file and Redis."""
        return {
            "id": self.key_id,
            "tenant": self.tenant,
            "name": self.name,
            "digest": self.digest,
            "created_at": self.created_at,
            "disabled": self.disabled,
            "policy": policy_to_dict(self.policy),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyRecord:
        """Parse and check a stored record."""
        key_id, tenant, digest = data.get("id"), data.get("tenant"), data.get("digest")
        if not isinstance(key_id, str) or not valid_key_id(key_id):
            raise ValueError("a key record needs a valid 'id'")
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f"key {key_id}: 'tenant' must be a non-empty string")
        if not isinstance(digest, str) or not digest.startswith(("sha256:", "hmac-sha256:")):
            raise ValueError(f"key {key_id}: 'digest' must be sha256:<hex> or hmac-sha256:<hex>")
        policy = data.get("policy") or {}
        if not isinstance(policy, dict):
            raise ValueError(f"key {key_id}: 'policy' must be a mapping")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
        created = data.get("created_at", 0.0)
        if (
            isinstance(created, bool)
            or not isinstance(created, int | float)
            or not math.isfinite(created)
        ):
            raise ValueError(f"key {key_id}: 'created_at' must be finite epoch seconds")
        try:
            parsed_policy = policy_from_dict(policy)
        except ValueError as exc:
            raise ValueError(f"key {key_id}: {exc}") from None
        return cls(
            key_id=key_id,
            tenant=tenant,
            digest=digest,
            policy=parsed_policy,
            created_at=float(created),
            name=str(data.get("name") or ""),
            disabled=bool(data.get("disabled", False)),
        )


def check_owner(tenant: str, name: str) -> None:
    """Raise :class:`PolicyError` unless ``tenant`` (1 to 200 characters) and ``name`` (at most
    200) are printable."""
    for param, value, least in (("tenant", tenant, 1), ("name", name, 0)):
        if not least <= len(value) <= MAX_OWNER_CHARS or not value.isprintable():
            raise PolicyError(
                f"a key's {param} has {least} to {MAX_OWNER_CHARS} printable characters",
                param=param,
            )


def issue_key(
    tenant: str, policy: KeyPolicy, *, now: float, name: str = "", pepper: bytes | None = None
) -> tuple[KeyRecord, str]:
    """A new record and its key (the only time the key exists in clear)."""
    if not tenant:
        raise ValueError("a key needs a tenant")
    key_id = new_key_id()
    token = f"{KEY_PREFIX}-{key_id}-{_new_secret()}"
    record = KeyRecord(key_id, tenant, key_digest(token, pepper), policy, now, name)
    return record, token


def rotate_key(record: KeyRecord, pepper: bytes | None = None) -> tuple[KeyRecord, str]:
    """The same id and policy with a new secret; the old key stops matching."""
    token = f"{KEY_PREFIX}-{record.key_id}-{_new_secret()}"
    return replace(record, digest=key_digest(token, pepper)), token


@dataclass(frozen=True, slots=True)
class DamagedRecord:
    """A stored entry that is not a valid key record: listed as such, never served."""

    ref: str  # the key id when it can be read, else where the entry is (``entry 3``)
    reason: str  # what is wrong, naming fields, never quoting stored values

    def describe(self) -> dict[str, Any]:
        """A listing row for this entry."""
        return {"id": self.ref, "status": "damaged", "error": self.reason}


class KeyStore(Protocol):
    """Where key records live: a YAML file or Redis. Raises KeyStoreUnavailable on IO errors.

    Damaged entries (not valid records) are never returned by ``get`` / ``all``; ``damaged``
    lists them.
    """

    async def get(self, key_id: str) -> KeyRecord | None:
        """The record with this id, if any."""
        ...

    async def put(self, record: KeyRecord) -> None:
        """Create or replace a record."""
        ...

    async def all(self) -> list[KeyRecord]:
        """Every record, disabled ones included, sorted by creation time."""
        ...

    async def damaged(self) -> list[DamagedRecord]:
        """Every stored entry that is not a valid record."""
        ...


def _expires_at(expires_in_days: float | None, now: float) -> float | None:
    """When a key created at ``now`` expires (``None``: never); a bad number of days is refused."""
    if expires_in_days is not None and (
        isinstance(expires_in_days, bool)
        or not isinstance(expires_in_days, int | float)
        or not math.isfinite(expires_in_days)
        or not 0 < expires_in_days <= MAX_EXPIRY_DAYS
    ):
        raise PolicyError(
            f"expires_in_days must be a number of days above 0 and at most "
            f"{MAX_EXPIRY_DAYS} (ten years); leave it out for a key that does not "
            "expire",
            param="expires_in_days",
        )
    return now + expires_in_days * _DAY_S if expires_in_days is not None else None


def make_policy(
    *,
    tiers: list[str] | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    max_tokens: int | None = None,
    concurrency: int | None = None,
    expires_in_days: float | None = None,
    scopes: list[str] | None = None,
    max_n: int | None = None,
    now: float,
    known_tiers: tuple[str, ...] | None = None,
    budget_daily: float | None = None,
    budget_monthly: float | None = None,
    rules: list[str] | None = None,
    max_precise_share: float | None = None,
    precise_share_over: str | None = None,
    priority: str | None = None,
    queue_weight: float | None = None,
) -> KeyPolicy:
    """A checked policy from creation options (command line or admin API)."""
    unknown_scopes = set(scopes or ()) - KNOWN_SCOPES
    if unknown_scopes:
        raise PolicyError(
            f"unknown scopes {sorted(unknown_scopes)}; known: {sorted(KNOWN_SCOPES)}",
            param="scopes",
        )
    if tiers is not None and known_tiers is not None and set(tiers) - set(known_tiers):
        raise PolicyError(
            f"unknown tiers {sorted(set(tiers) - set(known_tiers))}; "
            f"configured: {list(known_tiers)}",
            param="tiers",
        )
    expires = _expires_at(expires_in_days, now)
    return policy_from_dict(
        {
            "tiers": tiers,
            "rpm": rpm,
            "tpm": tpm,
            "max_tokens": max_tokens,
            "concurrency": concurrency,
            "expires_at": expires,
            "scopes": scopes or [],
            "budget_daily": budget_daily,
            "budget_monthly": budget_monthly,
            "max_n": max_n,
            "rules": rules or [],
            "max_precise_share": max_precise_share,
            "precise_share_over": precise_share_over,
            "priority": priority,
            "queue_weight": queue_weight,
        }
    )


def describe(record: KeyRecord, now: float) -> dict[str, Any]:
    """A record for listings: everything but the digest."""
    status = "revoked" if record.disabled else ("active" if record.usable(now) else "expired")
    return {
        "id": record.key_id,
        "tenant": record.tenant,
        "name": record.name,
        "status": status,
        "created_at": record.created_at,
        "policy": policy_to_dict(record.policy),
    }


async def create_key(
    store: KeyStore,
    tenant: str,
    policy: KeyPolicy,
    *,
    now: float,
    name: str = "",
    pepper: bytes | None = None,
) -> tuple[KeyRecord, str]:
    """Issue and store a key; the returned key is never seen again."""
    record, token = issue_key(tenant, policy, now=now, name=name, pepper=pepper)
    await store.put(record)
    return record, token


async def revoke_key(store: KeyStore, key_id: str) -> KeyRecord | None:
    """Disable a key for good (the record stays for audit); ``None`` if unknown."""
    record = await store.get(key_id)
    if record is None:
        return None
    revoked = replace(record, disabled=True)
    await store.put(revoked)
    return revoked


async def rotate_stored_key(
    store: KeyStore, key_id: str, pepper: bytes | None = None
) -> tuple[KeyRecord, str] | None:
    """Give a key a new secret (same id and policy); ``None`` if unknown."""
    record = await store.get(key_id)
    if record is None:
        return None
    if record.disabled:
        raise ValueError(f"key {key_id} is revoked and cannot be rotated")
    rotated, token = rotate_key(record, pepper)
    await store.put(rotated)
    return rotated, token
