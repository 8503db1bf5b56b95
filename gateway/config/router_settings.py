"""The router's settings: the cost dial, the tier rules, shadow evaluation and spill-over.

Sections of :class:`gateway.config.settings.Settings` (``router``, ``router.shadow``,
``spillover``), kept in their own module; the settings' docstrings are the reference
(``tiergate config docs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from gateway.config.strict import Section

# Fields of the judge call that ``judge_fields`` may not hold: those the gateway writes itself,
# and those that change how much the judge generates (vLLM reads ``max_completion_tokens``
# before ``max_tokens``; the call is counted at most 16 tokens) or the shape of its answer.
JUDGE_OWN_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "n",
        "best_of",
        "use_beam_search",
        "min_tokens",
        "ignore_eos",
        "stream",
        "stream_options",
        "echo",
        "add_generation_prompt",
        "continue_final_message",
    }
)


class ShadowSettings(Section):
    """Shadow evaluation (gateway/routing/shadow.py): a sample answered again by the other tier."""

    # Share of fast-routed requests also sent to precise ("did we under-route?").
    fast_ratio: float = Field(default=0.0, ge=0, le=1)
    """Share of fast-routed requests also sent to the precise tier (did we under-route?)."""
    # Share of precise-routed requests also sent to fast ("did we over-route?").
    precise_ratio: float = Field(default=0.0, ge=0, le=1)
    """Share of precise-routed requests also sent to the fast tier (did we over-route?)."""
    max_concurrent: int = Field(default=4, ge=1)
    """Shadow requests in flight at most."""
    # Skip a shadow when the target replica reports more waiting requests than this.
    max_waiting: float = Field(default=0.0, ge=0)
    """Skip a shadow when the target replica reports more waiting requests than this."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Timeout of one shadow request."""
    window: int = Field(default=1000, ge=10)
    """Shadow results kept for the live agreement figures."""
    # JSON-lines file of shadow records (no prompt text); None keeps them in memory only.
    store: Path | None = None
    """JSON-lines file of shadow records: the router's hashed feature vector, score, tier,
    direction and agreement of each shadow, no prompt text (`tiergate router train
    --from-shadow` learns from it); unset: in memory only."""
    max_records: int = Field(default=20_000, ge=100)
    """Records kept in the store at most (two files, `store` and `store`.1, half each). A record
    with its feature vector is about 9 KB for a 300-character prompt (more for long ones)."""
    store_prompts: bool = False
    """Also write each shadowed prompt's text into the store (off: it may hold personal data;
    training needs only the feature vectors)."""
    judge_ratio: float = Field(default=0.0, ge=0, le=1)
    """Share of compared shadows whose fast answer is also graded by the precise tier with a
    fixed rubric (a judge call; policies/judge.py); 0: off."""
    judge_fields: dict[str, Any] = Field(default_factory=dict)
    """Fields added to each judge call's body (the gateway writes its model, messages, max_tokens
    and temperature). A precise tier serving a reasoning model spends the judge's 16 tokens
    thinking and never answers (`judge:unparsed`): tell it not to think, for Qwen3 on vLLM
    `{"chat_template_kwargs": {"enable_thinking": false}}`. Refused: the fields the gateway
    writes, and those that change how much the judge generates or how it answers
    (`max_completion_tokens`, `n`, `best_of`, `use_beam_search`, `min_tokens`, `ignore_eos`,
    `stream`, `stream_options`, `echo`, `add_generation_prompt`, `continue_final_message`)."""
    digest_key_file: Path | None = None
    """File holding the deployment secret (at least 16 bytes) that keys each record's prompt
    digest (HMAC-SHA-256, 96 bits): records of one prompt match, a guessed prompt cannot be
    confirmed without it. Unset: `store`.key, created with a random key (and a warning) when
    absent; without a store, a random key per process."""
    tenant_samples_per_minute: int | None = Field(default=30, ge=1)
    """Shadow samples one tenant may take per minute from one gateway (a fixed one-minute
    window, kept in memory: no Redis round trip on the request path); a request sampled
    beyond it is not shadowed (outcome `skipped_tenant_budget`), so a tenant flooding traffic
    cannot fill the store and the retrain's data with its own prompts. A tenant under the cap
    is sampled at the ratio as before. With N workers each counts its own share (the cap
    divided by N, rounded down, at least 1), so a tenant whose requests all come over one
    kept-alive connection, served by one worker, takes only that share; N gateway replicas
    take up to N times this.
    Null: no cap (uniform sampling)."""

    @field_validator("judge_fields")
    @classmethod
    def _judge_fields_leave_the_call_alone(cls, value: dict[str, Any]) -> dict[str, Any]:
        own = sorted(JUDGE_OWN_FIELDS.intersection(value))
        if own:
            raise ValueError(
                f"may not set {', '.join(own)}: the judge call's own fields (at most 16 "
                "tokens, one whole answer)"
            )
        return value


class RouterSettings(Section):
    artifact: Path | None = None
    """A router artifact (`tiergate router train`); unset: the one shipped with TierGate."""
    target_precise_share: float = Field(default=0.3, ge=0.0, le=1.0)
    """The cost dial: the share of `auto` traffic meant for the precise tier."""
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """A fixed classifier threshold instead of one derived from target_precise_share."""
    online_control: bool | None = None
    """Adjust the threshold online so the observed precise share tracks the target. Unset: on
    unless a fixed `threshold` is set (the artifact's reference scores never match a
    deployment's own traffic mix)."""
    dial_max_tenants: int = Field(default=256, ge=1, le=100_000)
    """Tenants with their own share controller per worker (about 120 KB each when its
    5,000-request window is full); the least recently seen is dropped beyond this, and a
    tenant without one meets the artifact's calibration for its target until it has traffic
    again."""
    dial_sync_interval_s: float = Field(default=0.25, gt=0.0, le=5.0)
    """How often each worker reads the live dial's targets (Redis, or the workers' shared
    directory) and applies a change made on another worker or replica."""
    fast_tier: str = "fast"
    """Which tier is the fast one."""
    precise_tier: str = "precise"
    """Which tier is the precise one."""
    structured_output_to_precise: bool = True
    """Send response_format json_schema requests to the precise tier."""
    json_object_to_precise: bool = False
    """Send response_format json_object requests to the precise tier (off: the classifier
    decides on the prompt's words, so asking for JSON does not buy the precise tier)."""
    tools_to_precise: bool = True
    """Send requests with tools the model may call to the precise tier (`tool_choice: "none"`
    is no tool use: the classifier decides)."""
    unwrap_packaging: bool = True
    """Score the user's own words: LaTeX blocks, code fences and strings of numbers the request
    does not refer to, chain-of-thought phrasing and padding are left out of the score
    (router_models/packaging.py; bench/results/packaging.md)."""
    long_prompt_tokens: int | None = 6000
    """Prompts estimated above this many tokens go to the precise tier (null: no such rule)."""
    # Tier fallback when the chosen tier has no healthy capacity: fast -> precise (on by
    # default); precise -> fast only for keys with the downgrade scope and this switch on.
    fallback_to_precise: bool = True
    """When the fast tier has no healthy replica, or stays full past its queue wait, use the
    precise tier (x-tiergate-fallback-from: fast; priced as precise)."""
    downgrade_to_fast: bool = False
    """When the precise tier has no healthy capacity, use the fast tier (keys with the downgrade
    scope only).
    """
    shadow: ShadowSettings = Field(default_factory=ShadowSettings)
    """Shadow evaluation: a sample answered again by the other tier."""


class SpilloverSettings(Section):
    """Spill across tiers: a request goes to the other tier when that serves it sooner."""

    enabled: bool = False
    """Estimate each tier's time to first token from its replicas' own signals and send a
    classifier-routed request to the other tier when that starts it sooner by ``margin_s``
    (up: keys that may use the precise tier; down: keys with the ``downgrade`` scope).
    """
    margin_s: float = Field(default=0.25, ge=0)
    """How many seconds sooner the other tier must be estimated to start the request."""
    assumed_request_s: float = Field(default=1.0, gt=0)
    """Seconds one request is assumed to hold a slot on a replica whose drain rate is not yet
    known (no finished requests seen between two scrapes)."""
