"""All configuration, read once: environment (``TIERGATE_*``) over an optional YAML file.

With gateway/config/file.py, the only code that reads the environment or configuration files.
The file may use ``${VAR}`` and ``${VAR:-default}``; the environment overrides nested settings
with ``__`` (``TIERGATE_SERVER__PORT=9000``, ``TIERGATE_TIERS__FAST__REPLICAS='[...]'``). The
router's sections are in gateway/config/router_settings.py, the tiers' in
gateway/config/tier_settings.py.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, cast
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from gateway.config.file import interpolated_names, load_yaml
from gateway.config.router_settings import RouterSettings, SpilloverSettings
from gateway.config.strict import (
    ConfigError,
    Loc,
    Origins,
    Section,
    env_json_problem,
    env_paths,
    format_validation_error,
)
from gateway.config.tier_settings import TierSettings, default_tiers, over_default_tiers

# The YAML file of the Settings being built (load_settings): concurrent loads never share it.
_FILE_DATA: ContextVar[dict[str, Any]] = ContextVar("tiergate_file_data", default={})  # noqa: B039  # never mutated

MIN_ADMIN_TOKEN_CHARS = 16  # the admin token's least length, checked where it is read


class ServerSettings(Section):
    host: str = "127.0.0.1"
    """Address the gateway listens on; 0.0.0.0 only with TLS in front (see exposure)."""
    port: int = Field(default=8080, ge=0, le=65535)
    """TCP port the gateway listens on."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body accepted; bigger bodies get 413."""
    tls_terminated_upstream: bool = False
    """True when a TLS-terminating proxy sits in front (silences the public-bind exposure error)."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long in-flight requests and streams get to finish."""
    max_head_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    """Request line + headers limit; a longer head gets 431 and the connection is closed."""
    head_timeout_s: float = Field(default=10.0, gt=0)
    """A head must be complete this long after accept (or its first byte), else 408."""
    body_timeout_s: float = Field(default=10.0, gt=0)
    """A request body pausing longer than this gets 408 and a close; also the min-rate grace."""
    body_min_rate_bytes_s: int = Field(default=1024, ge=0)
    """After body_timeout_s, a body slower than this on average gets 408 (0: pauses only)."""
    idle_timeout_s: float = Field(default=75.0, gt=0)
    """Keep-alive connections idle this long are closed (above load balancers' usual 60 s)."""
    write_timeout_s: float = Field(default=60.0, gt=0)
    """A client that reads nothing this long while answers wait for it is disconnected."""
    stream_stall_s: float = Field(default=15.0, gt=0)
    """A stream whose client reads nothing this long is cut: backend aborted, slot freed."""
    max_connections: int | None = Field(default=None, ge=1)
    """Open client connections per worker; unset: half of what the fd limit leaves."""
    max_connections_reserve: int = Field(default=64, ge=0)
    """Past the cap, all busy: this many more, for /livez and /readyz only (others 503)."""
    workers: int | None = Field(default=None, ge=1, le=256)
    """Worker processes on one socket; unset: usable cores (1 with keys + memory limiter)."""
    worker_stall_s: float = Field(default=10.0, ge=0)
    """A worker whose event loop has not run for this long is killed and replaced (0: never)."""
    worker_start_timeout_s: float = Field(default=120.0, ge=0)
    """A worker starting this long (waits for a CPU not counted) is killed, replaced (0: never)."""


class AuthSettings(Section):
    enabled: bool = True
    """Require an API key; false only for local development (every caller is the development
    principal).
    """
    store: Literal["file", "redis"] = "file"
    """Where keys live: file (keys_file) or redis (shared by every gateway replica)."""
    keys_file: Path | None = None
    """The hashed key file for store: file (created by `tiergate keys create`)."""
    admin_token: str | None = Field(default=None, repr=False)
    """Bearer token for /metrics and /admin/*; prefer admin_token_file. Unset: admin routes off."""
    admin_token_file: Path | None = None
    """File holding the admin token (e.g. a mounted secret)."""
    # Redis store: how long a verified record / an unknown id is kept locally. Changes are
    # pushed to every replica over pub/sub at once; these are backstops (docs/key-revocation.md).
    cache_ttl_s: float = Field(default=30.0, ge=0)
    """How long a verified key is cached locally (a backstop: the Redis store pushes changes at
    once).
    """
    unknown_key_cache_ttl_s: float = Field(default=10.0, ge=0)
    """How long an unknown key id is remembered as unknown (Redis store)."""
    # Optional server-side secret: key digests become HMAC-SHA-256(pepper, key). Changing it
    # invalidates every existing key.
    pepper: str | None = Field(default=None, repr=False)
    """Optional server-side secret: key digests become HMAC-SHA-256(pepper, key). Changing it
    invalidates every key.
    """
    # File store: how often the key file's mtime is checked, i.e. the bound on how long a
    # revocation written to the file by another process takes to apply here.
    keys_reload_interval_s: float = Field(default=1.0, ge=0)
    """How often the key file is checked for changes (0: every request)."""

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, token: str | None) -> str | None:
        if token and len(token) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"the admin token must have at least {MIN_ADMIN_TOKEN_CHARS} characters"
            )
        return token

    def read_admin_token(self) -> str | None:
        """The admin token from the setting or its file; ``None`` keeps admin routes off."""
        if self.admin_token:
            return self.admin_token
        if self.admin_token_file is not None:
            token = self.admin_token_file.read_text(encoding="utf-8").strip()
            if token and len(token) < MIN_ADMIN_TOKEN_CHARS:
                raise ConfigError(
                    [
                        f"auth.admin_token_file ({self.admin_token_file}): the admin token in it "
                        f"must have at least {MIN_ADMIN_TOKEN_CHARS} characters"
                    ]
                )
            return token or None
        return None


class RateLimitSettings(Section):
    backend: Literal["memory", "redis"] = "memory"
    """Where limit counters live: memory (one replica) or redis (shared by all replicas)."""
    on_redis_error: Literal["open", "closed"] = "open"
    """When Redis is unreachable: open (degrade to local limits) or closed (refuse with 503)."""
    default_completion_tokens: int = Field(default=256, ge=1)
    """No longer used: every forwarded request carries max_tokens (tiers.X.default_max_tokens or
    the cap), which is what is reserved. Kept so existing configuration files still load."""
    # While Redis is down and on_redis_error is "open", each process enforces 1/N of every
    # key's limits and budgets locally: N is the live gateway processes counted in Redis
    # (gateway/limits/census.py) unless this overrides it with a replica count (times the workers).
    degraded_replicas: int | None = Field(default=None, ge=1)
    """While Redis is down (open), each replica enforces 1/N of every key's limits and budgets;
    unset, N is counted live in Redis (every worker of every replica); set, N replicas.
    """
    memory_divide_per_worker: bool = False
    """Memory backend, several workers: divide each key's limits among them (else refused)."""
    redis_retry_interval_s: float = Field(default=1.0, gt=0)
    """How often a degraded limiter tries Redis again."""
    precise_share_window: int = Field(default=1000, ge=2, le=100_000)
    """The precise-share caps' sliding window: a key's (or tenant's) last this many requests."""
    tenant_precise_share: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=dict
    )
    """Per tenant: the most of its keys' recent requests (together) that may go precise."""
    tenant_precise_share_over: Literal["downgrade", "refuse"] = "downgrade"
    """Over a tenant's cap: serve on the fast tier, or refuse with 429."""


class RedisSettings(Section):
    url: str = Field(default="redis://127.0.0.1:6379/0", repr=False)
    """Redis URL (redis:// or rediss://); a password in it is never logged."""
    password_file: Path | None = None
    """File holding the Redis password (a mounted secret; read when a client opens). The URL
    then carries none. Trailing newlines are dropped (as a shell's `$(cat FILE)`, which
    compose and the chart give Redis); any other character, spaces included, is the
    password's.
    """
    socket_timeout_s: float = Field(default=0.25, gt=0)
    """Per-command Redis timeout; keep it short, it is on the request path."""
    key_prefix: str = "tiergate:"
    """Prefix of every Redis key the gateway writes."""

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        # Checked here, not first in each worker; the message never quotes it (a password).
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("the Redis URL must start with redis://, rediss:// or unix://")
        try:
            parts.port  # noqa: B018  # parsing it raises on a port that is not a number
        except ValueError:
            raise ValueError("the Redis URL's port must be a number from 0 to 65535") from None
        return url

    @model_validator(mode="after")
    def _one_password(self) -> RedisSettings:
        # redis-py would let the URL's password win and the file's be ignored without a word.
        if self.password_file is not None and urlsplit(self.url).password is not None:
            raise ValueError(
                "redis.url carries a password and redis.password_file is set: give one"
            )
        return self

    def read_password(self) -> str | None:
        """The password from ``password_file`` without its trailing newlines (``None`` when
        unset or empty)."""
        if self.password_file is None:
            return None
        try:
            return self.password_file.read_text(encoding="utf-8").rstrip("\n") or None
        except OSError as exc:
            where = f"redis.password_file ({self.password_file})"
            raise ConfigError([f"{where}: cannot be read ({exc.strerror})"]) from None


def _otel_environment() -> dict[str, str]:
    """The standard ``OTEL_*`` variables (exporter, protocol, endpoint...), read here once."""
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


class TelemetrySettings(Section):
    """Logs, metrics and traces (gateway/telemetry); trace export follows ``OTEL_*``."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """json, console, or auto (console on a terminal, json otherwise)."""
    log_file: Path | None = None
    """Also write logs to this file."""
    access_log: bool = True
    """One log line per request."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve /metrics unauthenticated on this separate port; unset: /metrics behind the admin
    token.
    """
    metrics_host: str | None = None
    """The address metrics_port listens on; unset: server.host. In a container on several
    networks, its address on the monitoring network keeps the port off the others.
    """
    tracing: bool = False
    """Export OpenTelemetry traces (exporter and endpoint from OTEL_* variables)."""
    trace_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of requests traced when tracing is on. The default 1.0 traces every request: use
    0.01-0.1 in production.
    """
    trust_caller_sampling: bool = False
    """Let a caller's traceparent decide sampling (parent-based: its sampled flag wins over
    trace_sample_ratio). Off: every request is sampled at trace_sample_ratio, whatever the
    caller's flag says (the caller's trace id is still kept); turn on only where every caller
    is trusted to spend the tracing budget.
    """
    capture_content: bool = False
    """Put prompts and completions into spans (off: they may hold personal data)."""
    capture_content_max_chars: int = Field(default=32_768, ge=64)
    """With capture_content: the most characters of prompt text, and of answer text, a span
    holds (the rest is left out, and the span's ``tiergate.content.clipped`` is true). Bounds
    what a long answer holds while it streams and the size of each exported span.
    """
    stage_spans: bool = False
    """One child span per request stage (auth, validate, classify, ratelimit, and a route span
    per attempt). Off: the stages' durations are attributes of the server span
    (``tiergate.stage.<stage>.duration_ms``) and the route's of the client span: the same
    facts in 2 spans instead of 7, about half the CPU per traced request (bench/tracing).
    """
    # Read from OTEL_* (not a setting of the file): excluded from dumps, schema and docs.
    otel_env: SkipJsonSchema[dict[str, str]] = Field(
        default_factory=_otel_environment, repr=False, exclude=True
    )


class RetrySettings(Section):
    """Retries before the first byte (gateway/upstream/retry.py)."""

    max_attempts: int = Field(default=3, ge=1, le=10)
    """Attempts per request, the first included."""
    backoff_base_s: float = Field(default=0.02, ge=0)
    """First backoff between attempts (jittered, doubling)."""
    backoff_max_s: float = Field(default=0.5, ge=0)
    """Longest backoff between attempts."""
    max_retry_after_s: float = Field(default=2.0, ge=0)
    """Longest Retry-After from an upstream the gateway waits for before retrying."""
    max_cooldown_s: float = Field(default=30.0, ge=0)
    """Longest time a replica that answered 429/503 with Retry-After is skipped."""
    # Retries of requests a backend may have started: at most budget_ratio of the requests of
    # the last budget_window_s seconds, plus budget_min a second. Refused connections are
    # always retried on another replica and never charged.
    budget_ratio: float = Field(default=0.2, ge=0, le=1)
    """Retries of requests a backend may have started: at most this share of the requests of the
    last budget_window_s.
    """
    budget_min: float = Field(default=3.0, ge=0)
    """Plus this many such retries a second, whatever the ratio says."""
    budget_window_s: float = Field(default=10.0, ge=1, le=300)
    """The window of the retry budget (refused connections are always retried and never charged)."""


class HealthSettings(Section):
    """Active health checks, /metrics scrapes and passive outlier ejection (issue 5)."""

    interval_s: float = Field(default=0.5, gt=0)
    """How often each replica is probed."""
    timeout_s: float = Field(default=0.5, gt=0)
    """Timeout of one probe."""
    unhealthy_after: int = Field(default=2, ge=1)
    """Failed probes in a row before a replica is marked unhealthy."""
    healthy_after: int = Field(default=1, ge=1)
    """Good probes in a row before it is healthy again."""
    scrape_metrics: bool = True
    """Also scrape each replica's /metrics (queue depth, KV-cache use) for balancing."""
    metrics_every: int = Field(default=1, ge=1)
    """Scrape /metrics every this many rounds; on the rounds between, read a vLLM replica's
    cheaper GET /load (while it tracks server load: --enable-server-load-tracking)."""
    eject_after: int = Field(default=5, ge=1)
    """Consecutive request failures (connection errors, 5xx) before a replica is ejected."""
    eject_base_s: float = Field(default=2.0, gt=0)
    """First ejection time; it doubles with each ejection."""
    eject_max_s: float = Field(default=60.0, gt=0)
    """Longest ejection time."""
    max_ejected_share: float = Field(default=0.5, ge=0, le=1)
    """Never eject more than this share of a tier's replicas."""


class BalancingSettings(Section):
    """Prefix keys and the prefix-affinity strategy's load rules (policies/selection.py)."""

    block_chars: int = Field(default=256, ge=16)
    """Characters per prefix block hashed for prefix affinity."""
    max_blocks: int = Field(default=128, ge=1)
    """Blocks of a prompt hashed at most."""
    load_factor: float = Field(default=1.25, ge=1.0)
    """A replica is preferred while its in-flight count stays within this multiple of the mean."""
    load_slack: float = Field(default=4.0, ge=0)
    """Extra in-flight requests tolerated above load_factor, so light traffic is not spread."""
    imbalance_abs: float = Field(default=16.0, ge=0)
    """Imbalance guard: absolute in-flight gap between busiest and idlest replica."""
    imbalance_rel: float = Field(default=1.5, ge=1.0)
    """Imbalance guard: busiest above this multiple of idlest."""
    speed_aware: bool = True
    """Prefer the clearly faster replica of a tier (least_loaded; prefix_affinity's hash
    weight, load bound and fallbacks): a replica whose decode seconds per token (a moving
    average over its complete streamed answers, the time after their first token; whole
    answers do not count) is speed_margin times the fastest's or more has its load weighted
    by that ratio. False: speeds are still measured (/admin/backends) but never used."""
    speed_margin: float = Field(default=1.5, gt=1.0)
    """How much slower than the tier's fastest replica one must be before speed counts, so
    that replicas of equal speed are chosen exactly as without it."""
    speed_half_life_s: float = Field(default=5.0, gt=0)
    """A replica's speed without new answers moves halfway to the others' mean in this time,
    so that one found slow, and hence sent little, is tried again (docs/replicas.md)."""


class RequestSettings(Section):
    """What request bodies may contain (policies/fields.py, policies/requests.py)."""

    # Fields outside OpenAI's API and the documented sampling extras: refuse (400) or drop.
    unknown_fields: Literal["reject", "drop"] = "reject"
    """Fields outside OpenAI's API and the documented sampling extras: reject (400) or drop."""
    # More field names to forward for every key (e.g. a sampling extra of your engine).
    allowed_extra_fields: list[str] = Field(default_factory=list)
    """More field names to forward for every key (e.g. a sampling extra of your engine)."""
    # Deepest nesting of objects and arrays accepted in a body (OpenAI bodies need < 10).
    max_json_depth: int = Field(default=64, ge=4, le=512)
    """Deepest nesting of objects and arrays accepted in a body."""
    # A replica's prefix cache answering one tenant's prompt from another's blocks tells the
    # second what the first sent (cached_tokens, time to first token): policies/prefix.py.
    prefix_cache_scope: Literal["tenant", "shared"] = "tenant"
    """tenant: a cache_salt of the key's tenant (and the caller's own) is forwarded, so tenants
    never share cached prefixes (vLLM); shared: the caller's cache_salt as sent."""


class QueueSettings(Section):
    """Requests waiting for a full tier's slots (upstream/fair_queue.py, docs/overload.md)."""

    policy: Literal["fair", "fifo"] = "fair"
    """fair: interactive before batch, weighted fair across tenants; fifo: arrival order."""
    max_length: int = Field(default=1024, ge=1)
    """Requests waiting per tier per worker at most; then a newcomer takes the newest place of
    the tenant holding the most (fair), or gets 503 at once."""
    interactive_wait_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Longest wait of an interactive request (unset: the tier's max_queue_wait_s)."""
    batch_wait_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Longest wait of a batch request (unset: the tier's max_queue_wait_s)."""
    batch_max_share: float = Field(default=1.0, gt=0, le=1)
    """Share of a tier's slots (per worker) batch requests may hold at once, so interactive
    ones find a free slot; at least one slot. 1: no cap (batch may take every slot)."""

    def waits(self) -> dict[str, float]:
        """The classes' longest waits that are set."""
        given = {"interactive": self.interactive_wait_s, "batch": self.batch_wait_s}
        return {name: wait for name, wait in given.items() if wait is not None}


class ExposureSettings(Section):
    mode: Literal["off", "warn", "strict"] = "warn"
    """Start-up exposure self-check: off, warn (log findings) or strict (refuse to start on an
    error finding).
    """


class Settings(BaseSettings):
    """The whole configuration of one gateway process."""

    model_config = SettingsConfigDict(
        env_prefix="TIERGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        use_attribute_docstrings=True,
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    """Listening address and request limits."""
    tiers: dict[str, TierSettings] = Field(default_factory=default_tiers)
    """The tiers by name: each one served model on one or more replicas."""
    queue: QueueSettings = Field(default_factory=QueueSettings)
    """Who gets a full tier's next free slot, and how long a request waits for one."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """API keys and the admin token."""
    ratelimit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    """Per-key rate and token limits."""
    redis: RedisSettings = Field(default_factory=RedisSettings)
    """The Redis server used by ratelimit.backend: redis and auth.store: redis."""
    router: RouterSettings = Field(default_factory=RouterSettings)
    """How `auto` requests are routed between tiers."""
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    """Logs, metrics and traces."""
    exposure: ExposureSettings = Field(default_factory=ExposureSettings)
    """The start-up exposure self-check."""
    requests: RequestSettings = Field(default_factory=RequestSettings)
    """What request bodies may contain."""
    retry: RetrySettings = Field(default_factory=RetrySettings)
    """Retries before the first byte reached the client."""
    health: HealthSettings = Field(default_factory=HealthSettings)
    """Active health checks and passive ejection of replicas."""
    balancing: BalancingSettings = Field(default_factory=BalancingSettings)
    """Prefix keys and the load rules of prefix affinity."""
    spillover: SpilloverSettings = Field(default_factory=SpilloverSettings)
    """Borderline requests to an idle precise tier."""

    @model_validator(mode="after")
    def _tiers_known(self) -> Settings:
        if barred := [t for t in self.tiers if "|" in t]:  # Redis usage: tier|tenant|key|…
            raise ValueError(f"a tier's name may not hold '|' (a tenant's may): {barred}")
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
    ignored so optional command-line flags can be passed straight through. Raises
    :class:`ConfigError` (one line per problem, saying what and where) for any bad input.
    """
    return load_settings_traced(config, **overrides)[0]


def load_settings_traced(config: Path | None = None, **overrides: Any) -> tuple[Settings, Origins]:
    """:func:`load_settings`, and where each value came from."""
    if config is None:
        env_path = os.environ.get("TIERGATE_CONFIG")
        config = Path(env_path) if env_path else None
    data: dict[str, Any] = load_yaml(config) if config is not None else {}
    referenced = interpolated_names(config) if config is not None else set()
    env, problems = env_paths(Settings, os.environ, referenced)
    if problems:
        raise ConfigError(problems)
    nested: dict[str, dict[str, Any]] = {}
    flags: dict[Loc, str] = {}
    for name, value in overrides.items():
        if value is not None:
            section, _, field = name.partition("__")
            nested.setdefault(section, {})[field] = value
            flags[(section, field)] = f"--{field}"
    origins = Origins(config, data, env, flags)
    token = _FILE_DATA.set(over_default_tiers(data))
    try:
        return Settings(**cast(dict[str, Any], nested)), origins
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, Settings, origins.of)) from None
    except SettingsError as exc:  # an environment value that is not valid JSON for its field
        raise ConfigError([env_json_problem(str(exc), env)]) from None
    finally:
        _FILE_DATA.reset(token)
