"""A tier's upstream API keys, in order, for rotation without downtime.

vLLM's ``--api-key`` accepts several keys, so a key is rotated by starting the backends with
the old and the new one, giving the gateway both (``tiers.X.api_key: [new, old]``), then
dropping the old one everywhere. The gateway sends each replica the first key until that
replica refuses it (401/403); then the next one, and so on. Only when a replica has refused
every key since it last accepted one is it marked misconfigured.
The key each replica takes is remembered per gateway process; keys are never logged or shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import structlog

_NONE: Mapping[str, str] = {}
_log = structlog.get_logger("tiergate.health")


def _where(url: str) -> str:
    """host:port of a replica URL, without any user-info (safe to log)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port is not None else str(parts.hostname)


class UpstreamKeys:
    """The keys of one tier and, per replica URL, the one it takes now."""

    __slots__ = ("_current", "_refused", "headers")

    def __init__(self, keys: Sequence[str]) -> None:
        self.headers: tuple[Mapping[str, str], ...] = tuple(
            {"Authorization": f"Bearer {key}"} for key in keys
        )
        self._current: dict[str, int] = {}
        self._refused: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"UpstreamKeys({len(self.headers)} keys)"

    def __iter__(self) -> Iterator[Mapping[str, str]]:
        return iter(self.headers)

    @property
    def rotates(self) -> bool:
        """Whether there is more than one key to try."""
        return len(self.headers) > 1

    def first(self) -> Mapping[str, str]:
        """The first key's header (what every replica gets at first); empty without keys."""
        return self.headers[0] if self.headers else _NONE

    def for_replica(self, url: str) -> Mapping[str, str]:
        """The header ``url`` takes now."""
        if not self.headers:
            return _NONE
        return self.headers[self._current.get(url, 0)]

    def refused(self, url: str) -> bool:
        """``url`` refused its key: move it to the next one.

        True when another key is left to try; False when it has refused every key since it
        last accepted one (it is misconfigured; the next round starts over from the next key).
        """
        count = len(self.headers)
        if count < 2:
            return False
        index = self._current[url] = (self._current.get(url, 0) + 1) % count
        # The key's position in the list, never the key.
        _log.info("replica.upstream_key_refused", replica=_where(url), next_key_index=index)
        refusals = self._refused.get(url, 0) + 1
        if refusals >= count:
            self._refused.pop(url, None)
            return False
        self._refused[url] = refusals
        return True

    def accepted(self, url: str) -> None:
        """``url`` accepted the key it takes now."""
        if self._refused:
            self._refused.pop(url, None)

    def use(self, url: str, index: int) -> None:
        """``url`` accepted key ``index`` (found by a re-check): it takes that one from now."""
        self._current[url] = index
        self._refused.pop(url, None)


def every_key_refused(keys: UpstreamKeys | None, url: str) -> bool:
    """``url`` refused its key (401/403): True when that makes it misconfigured, False when
    it moved on to another key of the tier (:meth:`UpstreamKeys.refused`)."""
    return keys is None or not keys.refused(url)


def bearer_tokens(headers: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The bearer tokens (upstream keys) that ``headers`` send, each once."""
    tokens = (h.get("Authorization", "").removeprefix("Bearer ") for h in headers)
    return tuple(dict.fromkeys(t for t in tokens if t))


# A backend's message is cut at a length limit before it is blanked (the failure is built
# where the keys are not known): a cut that splits a key leaves its start at the text's end,
# blanked too from this many characters.
_CUT_KEY_MIN = 4


def blank(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every one of ``secrets`` in it replaced by ``[REDACTED]``, and the start of
    one that ends it (a text cut short in the middle of a key). The longest first: a key that
    starts another is not blanked out of the longer one, leaving its tail."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "[REDACTED]")
        for size in range(min(len(secret), len(text) + 1) - 1, _CUT_KEY_MIN - 1, -1):
            if text.endswith(secret[:size]):
                text = text[:-size] + "[REDACTED]"
                break
    return text
