"""The backends every conformance scenario runs against: one entry per simulator variant.

To add a flavour (sglang, llamacpp, ollama, tgi...), append a :class:`Backend` with the
simulator options that select it, and say which optional behaviours it has; scenarios that
need a behaviour the flavour lacks are reported as ``xfail`` with the reason, never skipped
silently.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backend:
    """One simulator variant and what it is known to do."""

    name: str
    sim_args: tuple[str, ...]
    # The server refuses requests without the key given by --api-key (vLLM: on /v1/* only).
    api_key: bool = True
    # The server reports cached prompt tokens with --enable-prompt-tokens-details.
    prompt_tokens_details: bool = True


BACKENDS: tuple[Backend, ...] = (
    Backend("vllm-0.11", ("--vllm-version", "0.11")),
    Backend("vllm-current", ("--vllm-version", "current")),
)
