"""The request body on its way in: decoding with a depth bound, and the field and media rules.

``decode`` refuses empty, invalid, non-object and too deeply nested JSON (400, never a
``RecursionError``); the first three share the code ``invalid_json``, as the README promises.
``FieldRules`` applies ``policies/fields.py`` per key scope and tier: the decided tier must
accept the body (else 400 naming the field), and fallback tiers that would not accept it are
dropped from the request's route rather than sent a body they refuse (remote media to an
inline-only tier, structured outputs to a tier without them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.pipeline.media import check_media
from policies.errors import InvalidRequest
from policies.fields import (
    STRUCTURED_OUTPUT_FIELDS,
    FieldPolicy,
    MediaUrl,
    check_fields,
    embedding_parts,
    has_content_parts,
    media_urls,
)
from policies.principal import SCOPE_ENGINE_FIELDS, Principal
from policies.requests import RequestKind, json_depth

_decoder = msgspec.json.Decoder()


def decode(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The JSON object body, or a 400 for an empty, invalid, non-object or too deep one."""
    if not raw:
        raise _invalid_json("The request body is empty; send a JSON object.")
    try:
        body = _decoder.decode(raw)
    except msgspec.DecodeError:
        raise _invalid_json("The request body is not valid JSON.") from None
    except RecursionError:  # msgspec's own guard, near 1,000 levels
        raise _too_deep(max_depth) from None
    # Cheap bound first: a body with fewer brackets than the limit cannot nest deeper.
    if raw.count(b"{") + raw.count(b"[") > max_depth and json_depth(body) > max_depth:
        raise _too_deep(max_depth)
    if not isinstance(body, dict):
        raise _invalid_json("The request body must be a JSON object.")
    return body


def _invalid_json(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_json")


def _too_deep(max_depth: int) -> InvalidRequest:
    return InvalidRequest(
        f"The request body nests objects and arrays more than {max_depth} levels deep.",
        code="json_too_deep",
    )


def _remote(urls: Sequence[MediaUrl]) -> bool:
    return any(not media.url.strip().lower().startswith("data:") for media in urls)


@dataclass(frozen=True, slots=True)
class FieldRules:
    """Which fields and media each tier accepts (policies/fields.py), per key scope."""

    structured: Mapping[str, bool]
    remote_media: Mapping[str, bool]
    policy: FieldPolicy = field(default_factory=FieldPolicy)
    max_depth: int = 64

    async def check(
        self,
        body: dict[str, Any],
        kind: RequestKind,
        principal: Principal,
        tiers: Sequence[str],
    ) -> tuple[str, ...]:
        """Refuse (400) what this key may not send to ``tiers[0]``; the tiers that accept it.

        Unknown fields the policy drops are removed from ``body``.
        """
        accepted, media = self.check_now(body, kind, principal, tiers)
        if media:
            await self.check_media(media, accepted[0])
        return accepted

    def check_now(
        self,
        body: dict[str, Any],
        kind: RequestKind,
        principal: Principal,
        tiers: Sequence[str],
    ) -> tuple[tuple[str, ...], list[MediaUrl]]:
        """:meth:`check` without the media URLs' address check: the tiers that accept the
        body, and the URLs still to pass :meth:`check_media` (none for most bodies) before
        the request may go on."""
        tier = tiers[0]
        engine = principal.policy.has_scope(SCOPE_ENGINE_FIELDS)
        check_fields(
            body,
            kind,
            self.policy,
            engine_fields=engine,
            structured_outputs=self.structured.get(tier, True),
        )
        urls: list[MediaUrl] = []
        if kind == "chat" and has_content_parts(body):
            embeds = embedding_parts(body)
            if embeds and not engine:
                raise InvalidRequest(
                    f"'{embeds[0]}': raw embedding parts are loaded by the engine; this key may "
                    "not send them.",
                    param=embeds[0],
                    code="field_not_allowed",
                )
            urls = media_urls(body)
        return (tier, *(t for t in tiers[1:] if self.accepts(body, t, urls))), urls

    async def check_media(self, urls: Sequence[MediaUrl], tier: str) -> None:
        """Every media URL inline or on a public host this tier may fetch (400 otherwise)."""
        await check_media(urls, remote_allowed=self.remote_media.get(tier, False))

    def accepts(
        self, body: Mapping[str, Any], tier: str, urls: Sequence[MediaUrl] | None = None
    ) -> bool:
        """Whether ``tier`` takes a body another tier already accepted (its tier rules only)."""
        if not self.structured.get(tier, True) and any(k in STRUCTURED_OUTPUT_FIELDS for k in body):
            return False
        if urls is None:
            urls = media_urls(dict(body)) if "messages" in body else []
        return not (_remote(urls) and not self.remote_media.get(tier, False))
