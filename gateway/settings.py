"""All configuration, read once: environment (``TIERGATE_*``) over an optional YAML file.

This is the only module that reads the environment or configuration files. The YAML file may
use ``${VAR}`` and ``${VAR:-default}``; nested settings are overridden from the environment
with ``__`` (``TIERGATE_SERVER__PORT=9000``, ``TIERGATE_TIERS__FAST__REPLICAS='["http://..."]'``).
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# The parsed YAML file for the Settings being built now (see load_settings); a ContextVar
# rather than a global so concurrent loads in tests cannot see each other's files.
_FILE_DATA: ContextVar[dict[str, Any]] = ContextVar("tiergate_file_data", default={})  # noqa: B039  # never mutated

_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ServerSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    tls_terminated_upstream: bool = False
    shutdown_grace_s: float = Field(default=30.0, ge=0)


class Timeouts(BaseModel):
    connect_s: float = Field(default=2.0, gt=0)
    first_byte_s: float = Field(default=60.0, gt=0)
    idle_s: float = Field(default=30.0, gt=0)
    total_s: float = Field(default=600.0, gt=0)


class TierCostSettings(BaseModel):
    """A tier's price (policies/cost.py): per 1k tokens, or per replica-hour and tokens/s."""

    input_per_1k: float | None = Field(default=None, ge=0)
    output_per_1k: float | None = Field(default=None, ge=0)
    replica_hour: float | None = Field(default=None, ge=0)
    tokens_per_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_way(self) -> TierCostSettings:
        per_token = self.input_per_1k is not None and self.output_per_1k is not None
        per_hour = self.replica_hour is not None and self.tokens_per_s is not None
        if per_token == per_hour:
            raise ValueError("set input_per_1k and output_per_1k, or replica_hour and "
                             "tokens_per_s (one pair)")
        return self

    def prices(self) -> tuple[float, float]:
        """(input, output) cost per 1,000 tokens."""
        if self.input_per_1k is not None and self.output_per_1k is not None:
            return self.input_per_1k, self.output_per_1k
        output = float(self.replica_hour or 0) / (float(self.tokens_per_s or 1) * 3.6)
        return output * 0.1, output


class TierSettings(BaseModel):
    model: str
    replicas: list[str] = Field(min_length=1)
    max_tokens_cap: int = Field(default=4096, ge=1)
    max_concurrency: int = Field(default=64, ge=1)
    max_queue_wait_s: float = Field(default=1.0, ge=0)
    strategy: Literal["round_robin", "least_loaded", "prefix_affinity"] = "prefix_affinity"
    timeouts: Timeouts = Field(default_factory=Timeouts)
    # Which inference server the replicas run (docs/backends.md); ``auto`` detects it.
    kind: Literal["auto", "vllm", "sglang", "llamacpp", "ollama", "tgi", "trtllm", "openai"] = (
        "auto"
    )
    # Overrides the route the health monitor probes (default: the kind's health route, else
    # /v1/models when the server has none).
    health_path: str | None = Field(default=None, pattern=r"^/[^?#]*$")
    # http(s) media URLs (image_url...) the backend would fetch itself; data: URLs always pass.
    allow_remote_media: bool = False
    # Whether the tier's engine accepts structured_outputs / guided_* fields.
    structured_outputs: bool = True
    # Price for usage, savings and compute budgets; unset: precise tier 1, others 0.25 per 1k.
    cost: TierCostSettings | None = None
    # The key the backends expect (vLLM's --api-key), sent as "Authorization: Bearer ...".
    # From the setting (TIERGATE_TIERS__<TIER>__API_KEY) or a secret file; never logged.
    api_key: SecretStr | None = Field(default=None, repr=False)
    api_key_file: Path | None = None
    # max_tokens written into requests that set none (None: the cap, key's or tier's).
    default_max_tokens: int | None = Field(default=None, ge=1)

    def read_api_key(self) -> str | None:
        """The upstream key from the setting or its file; ``None`` sends no Authorization."""
        key: str | None = None
        if self.api_key is not None and self.api_key.get_secret_value():
            key = self.api_key.get_secret_value()
        elif self.api_key_file is not None:
            key = self.api_key_file.read_text(encoding="utf-8").strip() or None
        if key is not None and not _HEADER_SAFE.fullmatch(key):
            # Never echo the value: it is a secret, and possibly a wrong file's contents.
            raise ValueError("the tier's upstream api_key must be printable ASCII without spaces")
        return key

    @field_validator("replicas")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"replica URL must start with http:// or https://: {url!r}")
        return [u.rstrip("/") for u in urls]


def _default_tiers() -> dict[str, TierSettings]:
    return {
        "fast": TierSettings(model="tiergate-fast", replicas=["http://127.0.0.1:8101"]),
        "precise": TierSettings(model="tiergate-precise", replicas=["http://127.0.0.1:8102"]),
    }


class AuthSettings(BaseModel):
    enabled: bool = True
    store: Literal["file", "redis"] = "file"
    keys_file: Path | None = None
    admin_token: str | None = Field(default=None, repr=False)
    admin_token_file: Path | None = None
    # Redis store: how long a verified record / an unknown id is kept locally. Changes are
    # pushed to every replica over pub/sub at once; these are backstops (docs/key-revocation.md).
    cache_ttl_s: float = Field(default=30.0, ge=0)
    unknown_key_cache_ttl_s: float = Field(default=10.0, ge=0)
    # Optional server-side secret: key digests become HMAC-SHA-256(pepper, key). Changing it
    # invalidates every existing key.
    pepper: str | None = Field(default=None, repr=False)
    # File store: how often the key file's mtime is checked, i.e. the bound on how long a
    # revocation written to the file by another process takes to apply here.
    keys_reload_interval_s: float = Field(default=1.0, ge=0)

    def read_admin_token(self) -> str | None:
        """The admin token from the setting or its file; ``None`` keeps admin routes off."""
        if self.admin_token:
            return self.admin_token
        if self.admin_token_file is not None:
            token = self.admin_token_file.read_text(encoding="utf-8").strip()
            return token or None
        return None


class RateLimitSettings(BaseModel):
    backend: Literal["memory", "redis"] = "memory"
    on_redis_error: Literal["open", "closed"] = "open"
    # No longer used: every forwarded request carries max_tokens (tiers.X.default_max_tokens
    # or the cap), which is what is reserved. Kept so existing configuration files still load.
    default_completion_tokens: int = Field(default=256, ge=1)
    # While Redis is down and on_redis_error is "open", each replica enforces 1/N of every
    # key's limits locally; set N to the number of gateway replicas.
    degraded_replicas: int = Field(default=1, ge=1)
    redis_retry_interval_s: float = Field(default=1.0, gt=0)


class RedisSettings(BaseModel):
    url: str = Field(default="redis://127.0.0.1:6379/0", repr=False)
    socket_timeout_s: float = Field(default=0.25, gt=0)
    key_prefix: str = "tiergate:"


class ShadowSettings(BaseModel):
    """Shadow evaluation (gateway/shadow.py): a sample answered again by the other tier."""

    # Share of fast-routed requests also sent to precise ("did we under-route?").
    fast_ratio: float = Field(default=0.0, ge=0, le=1)
    # Share of precise-routed requests also sent to fast ("did we over-route?").
    precise_ratio: float = Field(default=0.0, ge=0, le=1)
    max_concurrent: int = Field(default=4, ge=1)
    # Skip a shadow when the target replica reports more waiting requests than this.
    max_waiting: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)
    window: int = Field(default=1000, ge=10)
    # JSON-lines file of shadow records (no prompt text); None keeps them in memory only.
    store: Path | None = None
    max_records: int = Field(default=100_000, ge=100)


class RouterSettings(BaseModel):
    artifact: Path | None = None
    target_precise_share: float = Field(default=0.3, ge=0.0, le=1.0)
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    # None (default): the online share controller runs unless a fixed `threshold` is set;
    # the artifact's reference scores never match a deployment's own traffic mix.
    online_control: bool | None = None
    fast_tier: str = "fast"
    precise_tier: str = "precise"
    structured_output_to_precise: bool = True
    tools_to_precise: bool = True
    long_prompt_tokens: int | None = 6000
    # Tier fallback when the chosen tier has no healthy capacity: fast -> precise (on by
    # default); precise -> fast only for keys with the downgrade scope and this switch on.
    fallback_to_precise: bool = True
    downgrade_to_fast: bool = False
    shadow: ShadowSettings = Field(default_factory=ShadowSettings)


def _otel_environment() -> dict[str, str]:
    """The standard ``OTEL_*`` variables (exporter, protocol, endpoint...), read here once."""
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


class TelemetrySettings(BaseModel):
    """Logs, metrics and traces (gateway/telemetry); trace export follows ``OTEL_*``."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    log_file: Path | None = None
    access_log: bool = True
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    tracing: bool = False
    trace_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    capture_content: bool = False
    otel_env: dict[str, str] = Field(default_factory=_otel_environment, repr=False)


class RetrySettings(BaseModel):
    """Retries before the first byte (gateway/retry.py)."""

    max_attempts: int = Field(default=3, ge=1, le=10)
    backoff_base_s: float = Field(default=0.02, ge=0)
    backoff_max_s: float = Field(default=0.5, ge=0)
    max_retry_after_s: float = Field(default=2.0, ge=0)
    max_cooldown_s: float = Field(default=30.0, ge=0)
    # Retries of requests a backend may have started: at most budget_ratio of the requests of
    # the last budget_window_s seconds, plus budget_min a second. Refused connections are
    # always retried on another replica and never charged.
    budget_ratio: float = Field(default=0.2, ge=0, le=1)
    budget_min: float = Field(default=3.0, ge=0)
    budget_window_s: float = Field(default=10.0, ge=1, le=300)


class HealthSettings(BaseModel):
    """Active health checks, /metrics scrapes and passive outlier ejection (issue 5)."""

    interval_s: float = Field(default=0.5, gt=0)
    timeout_s: float = Field(default=0.5, gt=0)
    unhealthy_after: int = Field(default=2, ge=1)
    healthy_after: int = Field(default=1, ge=1)
    scrape_metrics: bool = True
    eject_after: int = Field(default=5, ge=1)
    eject_base_s: float = Field(default=2.0, gt=0)
    eject_max_s: float = Field(default=60.0, gt=0)
    max_ejected_share: float = Field(default=0.5, ge=0, le=1)


class BalancingSettings(BaseModel):
    """Prefix keys and the prefix-affinity strategy's load rules (policies/selection.py)."""

    block_chars: int = Field(default=256, ge=16)
    max_blocks: int = Field(default=128, ge=1)
    load_factor: float = Field(default=1.25, ge=1.0)
    load_slack: float = Field(default=4.0, ge=0)
    imbalance_abs: float = Field(default=16.0, ge=0)
    imbalance_rel: float = Field(default=1.5, ge=1.0)


class SpilloverSettings(BaseModel):
    """Borderline fast-tier requests to an idle precise tier when fast is saturated."""

    enabled: bool = False
    margin: float = Field(default=0.1, ge=0, le=1)
    fast_waiting: float = Field(default=4.0, ge=0)
    precise_max_utilisation: float = Field(default=0.5, gt=0, le=1)


class RequestSettings(BaseModel):
    """What request bodies may contain (policies/fields.py, policies/requests.py)."""

    # Fields outside OpenAI's API and the documented sampling extras: refuse (400) or drop.
    unknown_fields: Literal["reject", "drop"] = "reject"
    # More field names to forward for every key (e.g. a sampling extra of your engine).
    allowed_extra_fields: list[str] = Field(default_factory=list)
    # Deepest nesting of objects and arrays accepted in a body (OpenAI bodies need < 10).
    max_json_depth: int = Field(default=64, ge=4, le=512)


class ExposureSettings(BaseModel):
    mode: Literal["off", "warn", "strict"] = "warn"


def _interpolate(text: str) -> str:
    def repl(match: re.Match[str]) -> str:
        value = os.environ.get(match.group(1))
        if value is None or (value == "" and match.group(2) is not None):
            return match.group(2) or ""
        return value

    return _INTERPOLATION.sub(repl, text)


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config file with ``${VAR:-default}`` interpolation."""
    data = yaml.safe_load(_interpolate(path.read_text(encoding="utf-8"))) or {}
    if not isinstance(data, dict):
        raise TypeError(f"{path}: the top level must be a mapping")
    return data


class Settings(BaseSettings):
    """The whole configuration of one gateway process."""

    model_config = SettingsConfigDict(
        env_prefix="TIERGATE_", env_nested_delimiter="__", extra="forbid"
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    tiers: dict[str, TierSettings] = Field(default_factory=_default_tiers)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    ratelimit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    exposure: ExposureSettings = Field(default_factory=ExposureSettings)
    requests: RequestSettings = Field(default_factory=RequestSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    balancing: BalancingSettings = Field(default_factory=BalancingSettings)
    spillover: SpilloverSettings = Field(default_factory=SpilloverSettings)

    @model_validator(mode="after")
    def _tiers_known(self) -> Settings:
        for role in (self.router.fast_tier, self.router.precise_tier):
            if role not in self.tiers:
                raise ValueError(f"router tier {role!r} is not among tiers {list(self.tiers)}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))


class _FileSource(PydanticBaseSettingsSource):
    """The YAML file's values, below the environment and the command line."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return _FILE_DATA.get().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get())


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Build settings: ``overrides`` (command line) over environment over YAML over defaults.

    ``overrides`` use ``section__name`` keys (``server__port=9000``); ``None`` values are
    ignored so optional command-line flags can be passed straight through.
    """
    if config is None:
        env_path = os.environ.get("TIERGATE_CONFIG")
        config = Path(env_path) if env_path else None
    data: dict[str, Any] = load_yaml(config) if config is not None else {}
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in overrides.items():
        if value is not None:
            section, _, name = dotted.partition("__")
            nested.setdefault(section, {})[name] = value
    token = _FILE_DATA.set(data)
    try:
        return Settings(**cast(dict[str, Any], nested))
    finally:
        _FILE_DATA.reset(token)
