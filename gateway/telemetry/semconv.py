"""Every telemetry name TierGate emits, in one module (house convention 11).

GenAI span attributes follow the OpenTelemetry GenAI semantic conventions as published up to
semantic conventions v1.44 (checked against opentelemetry-semantic-conventions 0.66b2, where
they now point to the ``semantic-conventions-genai`` repository). Their status is Development,
so the names may still move: change them here only, never import ``_incubating`` constants.
HTTP, server and error attributes follow the stable HTTP conventions (v1.26+); ``tiergate.*``
attributes are our own. Metric names follow Prometheus conventions with one ``tiergate_``
prefix; the Grafana dashboard depends on them.
"""

from __future__ import annotations

from typing import Final

from gateway.pipeline.events import Outcome

INSTRUMENTATION_SCOPE: Final = "tiergate.gateway"
PROVIDER_VLLM: Final = "vllm"

# --- GenAI client-span attributes (one client span per upstream attempt) ---
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
# Opt-in content attributes (telemetry.capture_content); never set otherwise.
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"

OPERATION_CHAT: Final = "chat"
OPERATION_TEXT_COMPLETION: Final = "text_completion"

# Request fields copied to GenAI request attributes: the allowlist (anything else is dropped).
REQUEST_PARAMETERS: Final = (
    ("max_tokens", GEN_AI_REQUEST_MAX_TOKENS),
    ("max_completion_tokens", GEN_AI_REQUEST_MAX_TOKENS),
    ("temperature", GEN_AI_REQUEST_TEMPERATURE),
    ("top_p", GEN_AI_REQUEST_TOP_P),
    ("top_k", GEN_AI_REQUEST_TOP_K),
    ("seed", GEN_AI_REQUEST_SEED),
    ("frequency_penalty", GEN_AI_REQUEST_FREQUENCY_PENALTY),
    ("presence_penalty", GEN_AI_REQUEST_PRESENCE_PENALTY),
    ("n", GEN_AI_REQUEST_CHOICE_COUNT),
)

# --- HTTP / network attributes (stable conventions) ---
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_ROUTE: Final = "http.route"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# --- Our own span attributes ---
TG_REQUEST_ID: Final = "tiergate.request_id"
TG_KEY_ID: Final = "tiergate.key_id"
TG_TENANT: Final = "tiergate.tenant"
TG_TIER: Final = "tiergate.tier"
TG_ROUTE_REASON: Final = "tiergate.route.reason"
TG_ROUTE_SCORE: Final = "tiergate.route.score"
TG_ROUTE_STRATEGY: Final = "tiergate.route.strategy"
TG_ROUTE_PREFIX_BLOCKS: Final = "tiergate.route.prefix_blocks"
TG_ROUTE_PREFIX_MATCH: Final = "tiergate.route.prefix_match"
TG_REPLICA: Final = "tiergate.replica"
TG_ATTEMPT: Final = "tiergate.attempt"
TG_ATTEMPTS: Final = "tiergate.attempts"
TG_OUTCOME: Final = "tiergate.outcome"
TG_RATELIMIT_OUTCOME: Final = "tiergate.ratelimit.outcome"
# Without stage spans: each stage's duration on the server span, and the stage that failed.
TG_STAGE_DURATION: Final = "tiergate.stage.{}.duration_ms"
TG_STAGE_FAILED: Final = "tiergate.stage.failed"
TG_ROUTE_DURATION: Final = "tiergate.route.duration_ms"
# Captured content (telemetry.capture_content) was cut at capture_content_max_chars.
TG_CONTENT_CLIPPED: Final = "tiergate.content.clipped"

# --- Span names of the request stages (children of the server span) ---
SPAN_AUTH: Final = "tiergate.auth"
SPAN_VALIDATE: Final = "tiergate.validate"
SPAN_CLASSIFY: Final = "tiergate.classify"
SPAN_RATELIMIT: Final = "tiergate.ratelimit"
SPAN_ROUTE: Final = "tiergate.route"
STAGE_SPANS: Final = {
    "auth": SPAN_AUTH,
    "validate": SPAN_VALIDATE,
    "classify": SPAN_CLASSIFY,
    "ratelimit": SPAN_RATELIMIT,
}

# --- Prometheus metric names (without the ``_total`` suffix prometheus_client adds) ---
M_REQUESTS: Final = "tiergate_requests"
M_REQUEST_DURATION: Final = "tiergate_request_duration_seconds"
M_TTFT: Final = "tiergate_time_to_first_token_seconds"
M_TPOT: Final = "tiergate_time_per_output_token_seconds"
M_OVERHEAD: Final = "tiergate_overhead_seconds"
M_TOKENS: Final = "tiergate_tokens"
M_ROUTE_DECISIONS: Final = "tiergate_route_decisions"
M_PRECISE_SHARE: Final = "tiergate_precise_share"
M_PRECISE_SHARE_TARGET: Final = "tiergate_precise_share_target"
M_RATELIMIT_DECISIONS: Final = "tiergate_ratelimit_decisions"
M_UPSTREAM_ATTEMPTS: Final = "tiergate_upstream_attempts"
M_UPSTREAM_RETRIES: Final = "tiergate_upstream_retries"
M_REPLICA_HEALTHY: Final = "tiergate_replica_healthy"
M_REPLICA_IN_FLIGHT: Final = "tiergate_replica_in_flight"
M_REPLICA_BACKEND: Final = "tiergate_replica_backend_info"
M_STREAM_ABORTS: Final = "tiergate_stream_aborts"
M_STREAM_TRUNCATED: Final = "tiergate_stream_truncated"
M_STREAM_EMPTY: Final = "tiergate_stream_empty"
M_CONNECTIONS_OPEN: Final = "tiergate_connections_open"
M_CONNECTIONS_CAP: Final = "tiergate_connections_cap"
M_CONNECTIONS_SHED: Final = "tiergate_connections_shed"
M_QUEUE_WAIT: Final = "tiergate_queue_wait_seconds"
M_QUEUE_SHED: Final = "tiergate_queue_shed"
M_QUEUE_WAITING: Final = "tiergate_queue_waiting"
M_AUTH_REFUSALS: Final = "tiergate_auth_refusals"

# Label values
TOKENS_INPUT: Final = "input"
TOKENS_OUTPUT: Final = "output"
TOKENS_CACHED_INPUT: Final = "cached_input"  # a subset of ``input``: do not add the two
NO_TIER: Final = "none"
RATELIMIT_ALLOWED: Final = "allowed"
RATELIMIT_REJECTED: Final = "rejected"
RATELIMIT_ALL_LIMITS: Final = "all"

# Stream outcomes (gateway.upstream.relay) other than ``complete`` are aborts.
OUTCOME_COMPLETE: Final = Outcome.COMPLETE
OUTCOME_CLIENT_DISCONNECT: Final = Outcome.CLIENT_DISCONNECT

# --- Log event names (dotted constants) ---
EVENT_ACCESS: Final = "request.finished"
EVENT_LOGS_DROPPED: Final = "telemetry.log_lines_dropped"
EV_SPANS_UNFLUSHED: Final = "telemetry.spans_unflushed"
EV_CONNECTION_SHED: Final = "connection.shed"
EV_AUTH_REFUSED: Final = "auth.refused"
EV_SERVER_STARTED: Final = "server.started"
EV_WORKER_STARTED: Final = "server.worker_started"
EV_SERVER_DRAINING: Final = "server.draining"
EV_SERVER_STOPPED: Final = "server.stopped"
EV_PRICES_INVERTED: Final = "config.prices_inverted"
