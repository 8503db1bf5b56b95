"""The context-length pre-check: refuse only what certainly overflows (issue 36)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.context_window import (
    certain_prompt_tokens,
    fitting_tiers,
    max_tokens_that_fit,
)
from policies.errors import InvalidRequest
from policies.requests import RequestKind, RequestSummary, validate

TIERS = ("fast", "precise")


def _chat(content: Any, **fields: Any) -> tuple[dict[str, Any], RequestSummary]:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    return body, validate(body, "chat")


def _completion(prompt: Any, **fields: Any) -> tuple[dict[str, Any], RequestSummary]:
    body = {"model": "m", "prompt": prompt, **fields}
    kind: RequestKind = "completion"
    return body, validate(body, kind)


def test_the_lower_bound_is_eight_bytes_a_token_and_never_above_the_estimate() -> None:
    """ASCII and UTF-8 text at 8 bytes a token, token ids exactly; media and tools count 0."""
    body, summary = _chat("a" * 800)
    assert certain_prompt_tokens(body, summary) == 100
    body, summary = _chat("汉" * 80)  # 240 UTF-8 bytes
    assert certain_prompt_tokens(body, summary) == 30
    parts = [{"type": "text", "text": "b" * 160}, {"type": "image_url", "image_url": {"url": "x"}}]
    body, summary = _chat(parts, tools=[{"type": "function", "function": {"name": "f" * 900}}])
    assert certain_prompt_tokens(body, summary) == 20
    assert summary.prompt_token_estimate > 20 + 512  # the usual estimate counts the image
    body, summary = _completion(list(range(300)))
    assert certain_prompt_tokens(body, summary) == 300
    body, summary = _completion(["x" * 80, "y" * 800])
    assert certain_prompt_tokens(body, summary) == 100  # the longest prompt
    body, summary = _completion([list(range(30)), list(range(300))])
    assert (certain_prompt_tokens(body, summary), summary.prompts) == (300, 2)


def test_certainly_too_long_everywhere_is_a_400_naming_the_largest_context() -> None:
    """max_tokens alone beyond every context: context_length_exceeded, param messages."""
    body, summary = _chat("hi", max_tokens=5000)
    with pytest.raises(InvalidRequest) as info:
        fitting_tiers(body, summary, TIERS, {"fast": 512, "precise": 4096})
    error = info.value
    assert error.status == 400
    assert error.code == "context_length_exceeded"
    assert error.param == "messages"
    assert "maximum context length is 4096 tokens" in error.message
    assert "5000 for the completion ('max_tokens')" in error.message


def test_a_prompt_alone_beyond_the_context_is_refused_without_max_tokens() -> None:
    """No max_tokens: the prompt's lower bound reaching the context is enough; param prompt."""
    body, summary = _completion("z" * 8 * 600)
    with pytest.raises(InvalidRequest) as info:
        fitting_tiers(body, summary, ("fast",), {"fast": 600})
    assert info.value.param == "prompt"
    assert "at least 600 for the prompt" in info.value.message
    assert fitting_tiers(body, summary, ("fast",), {"fast": 601}) == ("fast",)


def test_tiers_that_cannot_fit_are_skipped_in_order() -> None:
    """The chosen tier too small, the fallback large enough: the fallback alone remains."""
    body, summary = _chat("hi", max_tokens=1000)
    assert fitting_tiers(body, summary, TIERS, {"fast": 512, "precise": 4096}) == ("precise",)
    assert fitting_tiers(body, summary, TIERS, {"fast": 512, "precise": None}) == ("precise",)


def test_near_the_edge_the_backend_decides() -> None:
    """The estimate overflows but the lower bound fits: every tier stays."""
    body, summary = _chat("abcd " * 320, max_tokens=200)  # estimate 401, lower bound 200
    assert summary.prompt_token_estimate + 200 > 512
    assert fitting_tiers(body, summary, ("fast",), {"fast": 512}) == ("fast",)


def test_unknown_contexts_never_refuse() -> None:
    """Backends that state no context length: nothing is refused or capped."""
    body, summary = _chat("hi", max_tokens=10**6)
    assert fitting_tiers(body, summary, TIERS, {}) == TIERS
    assert max_tokens_that_fit(summary, TIERS, {"fast": None}) is None


def test_a_missing_max_tokens_fits_the_smallest_known_context() -> None:
    """The cap is the smallest context minus the usual estimate, and at least 1."""
    _, summary = _chat("x" * 400)  # estimate 106: 100 for the text, 5 for the template, +1
    assert max_tokens_that_fit(summary, TIERS, {"fast": 512, "precise": 4096}) == 406
    assert max_tokens_that_fit(summary, TIERS, {"fast": None, "precise": 4096}) == 3990
    assert max_tokens_that_fit(summary, TIERS, {"fast": 50}) == 1
