"""The tiers' settings: each tier's model, replicas, timeouts, limits, upstream key and price.

The ``tiers`` section of :class:`~gateway.config.settings.Settings`, and the embedded tiers a
configuration that names none starts with (``fast`` and ``precise`` on local ports).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from gateway.config.strict import Section

_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")


class Timeouts(Section):
    connect_s: float = Field(default=2.0, gt=0)
    """Time to open a connection to a replica."""
    first_byte_s: float = Field(default=60.0, gt=0)
    """Time until the replica's first response byte (first token when streaming)."""
    idle_s: float = Field(default=30.0, gt=0)
    """Longest wait for a stream's next chunk (keep-alive comments do not count)."""
    total_s: float = Field(default=600.0, gt=0)
    """Deadline for the whole request, retries included."""


class TierCostSettings(Section):
    """A tier's price (policies/cost.py): per 1k tokens, or per replica-hour and tokens/s."""

    input_per_1k: float | None = Field(default=None, ge=0)
    """Cost of 1,000 prompt tokens (with output_per_1k)."""
    output_per_1k: float | None = Field(default=None, ge=0)
    """Cost of 1,000 completion tokens (with input_per_1k)."""
    replica_hour: float | None = Field(default=None, ge=0)
    """Cost of one replica-hour (with tokens_per_s, instead of the per-token prices)."""
    tokens_per_s: float | None = Field(default=None, gt=0)
    """Tokens per second one replica serves (with replica_hour)."""

    @model_validator(mode="after")
    def _one_way(self) -> TierCostSettings:
        per_token = self.input_per_1k is not None and self.output_per_1k is not None
        per_hour = self.replica_hour is not None and self.tokens_per_s is not None
        if per_token == per_hour:
            raise ValueError(
                "set input_per_1k and output_per_1k, or replica_hour and tokens_per_s (one pair)"
            )
        return self

    def prices(self) -> tuple[float, float]:
        """(input, output) cost per 1,000 tokens."""
        if self.input_per_1k is not None and self.output_per_1k is not None:
            return self.input_per_1k, self.output_per_1k
        output = float(self.replica_hour or 0) / (float(self.tokens_per_s or 1) * 3.6)
        return output * 0.1, output


class TierSettings(Section):
    model: str
    """The served model name the tier's backends answer to (vLLM --served-model-name)."""
    replicas: list[str] = Field(min_length=1)
    """Base URLs of the tier's backends (http:// or https://, no /v1)."""
    max_tokens_cap: int = Field(default=4096, ge=1)
    """Largest max_tokens / max_completion_tokens a request may ask of this tier (400 above)."""
    max_concurrency: int = Field(default=64, ge=1)
    """Requests in flight per replica at most before new ones wait; fewer while the replica
    reports itself full (capacity-waiting, admission rejections; docs/replicas.md)."""
    max_queue_wait_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    """How long a request waits for a free replica slot before a 503 with Retry-After."""
    strategy: Literal["round_robin", "least_loaded", "prefix_affinity"] = "prefix_affinity"
    """How a replica is picked: prefix_affinity (prefix-cache aware), least_loaded, round_robin."""
    timeouts: Timeouts = Field(default_factory=Timeouts)
    """Upstream timeouts for this tier."""
    kind: Literal[
        "auto", "vllm", "sglang", "llamacpp", "ollama", "tgi", "trtllm", "litellm", "openai"
    ] = "auto"
    """Which inference server the replicas run (docs/backends.md); `auto` detects it."""
    health_path: str | None = Field(default=None, pattern=r"^/[^?#]*$")
    """Overrides the route the health monitor probes (default: the kind's health route, else
    /v1/models when the server has none)."""
    allow_remote_media: bool = False
    """Forward http(s) media URLs (image_url...) that the backend would fetch itself; data: URLs
    always pass.
    """
    structured_outputs: bool = True
    """Whether the tier's engine accepts structured_outputs / guided_* fields."""
    cost: TierCostSettings | None = None
    """The tier's price for usage, savings and compute budgets; unset: precise 1, others 0.25 per
    1k tokens.
    """
    # NoDecode: an environment value is one key as it stands unless it is a JSON list.
    api_key: Annotated[SecretStr | list[SecretStr] | None, NoDecode] = Field(
        default=None, repr=False
    )
    """The key the backends expect (vLLM --api-key), sent as Authorization: Bearer; never logged.
    A list rotates: the first, and on a replica's 401/403 the next (docs/vllm-compat.md)."""
    api_key_file: Path | None = None
    """File holding the backends' key, or one key a line (instead of api_key)."""
    default_max_tokens: int | None = Field(default=None, ge=1)
    """max_tokens written into requests that set none (unset: the key's or the tier's cap)."""

    def read_api_key(self) -> str | None:
        """The first upstream key; ``None`` sends no Authorization."""
        keys = self.read_api_keys()
        return keys[0] if keys else None

    def read_api_keys(self) -> tuple[str, ...]:
        """The upstream keys, in order, from the setting or its file (one a line)."""
        given = self.api_key if isinstance(self.api_key, list) else [self.api_key]
        keys = [k.get_secret_value() for k in given if k is not None and k.get_secret_value()]
        if not keys and self.api_key_file is not None:
            text = self.api_key_file.read_text(encoding="utf-8")
            keys = [line.strip() for line in text.splitlines() if line.strip()]
        if not all(_HEADER_SAFE.fullmatch(key) for key in keys):
            # Never echo the value: it is a secret, and possibly a wrong file's contents.
            raise ValueError("the tier's upstream api_key must be printable ASCII without spaces")
        return tuple(keys)

    @field_validator("api_key", mode="before")
    @classmethod
    def _key_list(cls, value: object) -> object:
        if isinstance(value, str) and value.startswith("["):
            return json.loads(value)  # a JSON list from the environment
        return value

    @field_validator("api_key")
    @classmethod
    def _sendable(cls, keys: SecretStr | list[SecretStr] | None) -> object:
        given = keys if isinstance(keys, list) else [keys]
        values = [k.get_secret_value() for k in given if k is not None and k.get_secret_value()]
        if not all(_HEADER_SAFE.fullmatch(value) for value in values):
            raise ValueError("an upstream api_key must be printable ASCII without spaces")
        return keys

    @field_validator("replicas")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"replica URL must start with http:// or https://: {url!r}")
        return [u.rstrip("/") for u in urls]


# The embedded tiers, as the raw layer below the file: the environment's TIERGATE_TIERS__*
# values merge over them when the file has no `tiers:` (a file's `tiers:` replaces them).
_DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "fast": {"model": "tiergate-fast", "replicas": ["http://127.0.0.1:8101"]},
    "precise": {"model": "tiergate-precise", "replicas": ["http://127.0.0.1:8102"]},
}


def default_tiers() -> dict[str, TierSettings]:
    """The embedded tiers, built afresh (the ``tiers`` default)."""
    return {name: TierSettings(**copy.deepcopy(raw)) for name, raw in _DEFAULT_TIERS.items()}


def over_default_tiers(file_data: dict[str, Any]) -> dict[str, Any]:
    """The file's values with the embedded tiers under them when the file names no tiers."""
    if "tiers" in file_data:
        return file_data
    return {**file_data, "tiers": copy.deepcopy(_DEFAULT_TIERS)}
