"""The context-length pre-check: refuse what certainly cannot fit, bound what may.

A backend refuses a request whose prompt plus ``max_tokens`` exceeds its context
(``max_model_len``). The gateway has no tokenizer, so it refuses only when a **lower bound**
of the prompt's tokens already exceeds the context, and leaves the edge to the backend:

- text counts one token per 8 UTF-8 bytes (real tokenizers: about 4 characters a token for
  English, 3 to 4 for code, one or more per CJK character; only long runs of one repeated
  character, such as whitespace, reach more than 8 a token);
- token-id prompts count exactly; images, audio, tool definitions and the chat template count
  nothing;
- a completion request with several prompts is judged by its longest (the backend checks each).

A request without ``max_tokens`` gets one that fits: the context minus the gateway's usual
estimate of the prompt (:attr:`RequestSummary.prompt_token_estimate`, about 4 characters a
token, with JSON and media weighted), at least 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.errors import InvalidRequest
from policies.requests import RequestSummary

# The most UTF-8 bytes the gateway assumes one token covers, for its lower bound.
BYTES_PER_TOKEN_AT_MOST = 8


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _content_bytes(content: object) -> int:
    if isinstance(content, str):
        return _text_bytes(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for part in content:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str):
            total += _text_bytes(text)
    return total


def certain_prompt_tokens(body: Mapping[str, Any], summary: RequestSummary) -> int:
    """A lower bound of the prompt's tokens (the longest prompt's, for several prompts).

    ``body`` has passed validation (:func:`policies.requests.validate`).
    """
    if summary.kind == "chat":
        messages = body.get("messages") or []
        size = sum(_content_bytes(m.get("content")) for m in messages if isinstance(m, dict))
        return size // BYTES_PER_TOKEN_AT_MOST
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _text_bytes(prompt) // BYTES_PER_TOKEN_AT_MOST
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        longest = max(_text_bytes(p) for p in prompt if isinstance(p, str))
        return longest // BYTES_PER_TOKEN_AT_MOST
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return max(len(p) for p in prompt if isinstance(p, list))  # several: the longest
    return len(prompt) if isinstance(prompt, list) else 0  # token ids: exact


def fitting_tiers(
    body: Mapping[str, Any],
    summary: RequestSummary,
    tiers: tuple[str, ...],
    contexts: Mapping[str, int | None],
) -> tuple[str, ...]:
    """``tiers`` less those the request certainly overflows (their order kept).

    Raises a 400 ``context_length_exceeded`` when it overflows every one of them. A tier whose
    context is unknown (``None``: its backends did not say) always stays.
    """
    generated = summary.max_tokens or 1
    # The cheap test first: the usual estimate is never below the lower bound.
    needed = summary.prompt_token_estimate + generated
    for tier in tiers:
        context = contexts.get(tier)
        if context is not None and needed > context:
            break
    else:
        return tiers
    known = [contexts.get(tier) for tier in tiers]
    prompt = certain_prompt_tokens(body, summary)
    fit = tuple(
        tier for tier, c in zip(tiers, known, strict=True) if c is None or prompt + generated <= c
    )
    if fit:
        return fit
    largest = max(c for c in known if c is not None)
    param = "messages" if summary.kind == "chat" else "prompt"
    asked = (
        f"{prompt} for the {param} at least (the gateway's lower bound) plus "
        f"{summary.max_tokens} for the completion ('{summary.max_tokens_param}')"
        if summary.max_tokens is not None
        else f"at least {prompt} for the {param} (the gateway's lower bound)"
    )
    raise InvalidRequest(
        f"This model's maximum context length is {largest} tokens, and this request needs "
        f"more: {asked}. Shorten the {param} or lower the completion's length.",
        param=param,
        code="context_length_exceeded",
    )


def max_tokens_that_fit(
    summary: RequestSummary, tiers: Sequence[str], contexts: Mapping[str, int | None]
) -> int | None:
    """For a request without ``max_tokens``: the most that fits every known context of
    ``tiers`` after the prompt's usual estimate (at least 1); ``None`` when none is known."""
    smallest: int | None = None
    for tier in tiers:
        context = contexts.get(tier)
        if context is not None and (smallest is None or context < smallest):
            smallest = context
    if smallest is None:
        return None
    return max(1, smallest - summary.prompt_token_estimate)
