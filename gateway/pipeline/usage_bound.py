"""The most usage a backend may report for one request, so a broken or hostile backend cannot
charge a key for tokens the gateway never let it produce.

A backend's ``usage`` settles the key's token limits, budgets and the usage ledger. Left as
reported, one answer claiming 1.5e9 tokens would lock a key out of its tokens-per-minute limit
for weeks. The completion is bounded by what the gateway allowed (the ``max_tokens`` it
reserved, per completion); the prompt by the request body's size in bytes (no tokenizer makes
more than one text token of a byte) plus an allowance for what the backend adds itself (chat
template, images given by URL).
"""

from __future__ import annotations

import time
from typing import Final, NamedTuple

import structlog

from gateway.pipeline.events import Usage

_log = structlog.get_logger("tiergate.usage")
# Prompt tokens a backend may add to the body's own: chat template, tool schemas rendered,
# a few images sent as URLs (vLLM's vision models: up to some thousands of tokens each).
PROMPT_ALLOWANCE: Final = 32768
_WARN_EVERY_S: Final = 10.0


class UsageBound(NamedTuple):
    """The most prompt and completion tokens one request may be charged."""

    prompt: int
    completion: int

    @classmethod
    def of(cls, body_bytes: int, max_tokens: int, completions: int) -> UsageBound:
        """The bound of a request of ``body_bytes`` allowed ``max_tokens`` per completion."""
        return cls(body_bytes + PROMPT_ALLOWANCE, max(0, max_tokens) * max(1, completions))

    def over(self, usage: Usage) -> bool:
        """Whether ``usage`` claims more than the bound allows."""
        return usage.prompt_tokens > self.prompt or usage.completion_tokens > self.completion

    def clip(self, usage: Usage) -> Usage:
        """``usage`` with each count at most the bound's."""
        prompt = min(usage.prompt_tokens, self.prompt)
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=min(usage.completion_tokens, self.completion),
            cached_tokens=min(usage.cached_tokens, prompt),
        )


class UsageClipper:
    """Clips reported usage to each request's bound; warns at most every 10 s per process."""

    __slots__ = ("_warned_at", "clipped")

    def __init__(self) -> None:
        self._warned_at = -_WARN_EVERY_S
        self.clipped = 0  # requests clipped since start

    def __call__(
        self, usage: Usage | None, bound: UsageBound | None, tier: str | None
    ) -> Usage | None:
        """``usage`` within ``bound`` (``None`` and no bound: unchanged)."""
        if usage is None or bound is None or not bound.over(usage):
            return usage
        self.clipped += 1
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            _log.warning(
                "usage.clipped",
                tier=tier,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                prompt_bound=bound.prompt,
                completion_bound=bound.completion,
                clipped_since_start=self.clipped,
            )
        return bound.clip(usage)
