"""What the gateway reads from vLLM beyond load, and the routes vLLM leaves open.

Pure functions: the context length a model card states (``GET /v1/models``, ``max_model_len``),
the engine's sleep state on its ``/metrics`` page (``vllm:engine_sleep_state``), and the table
of vLLM routes that answer without the API key (``--api-key`` guards only ``/v1``, ``/v2``,
``/inference`` and ``/cohere``; vLLM 0.33, ``entrypoints/serve``). The gateway forwards none
of these routes; ``tiergate check-exposure`` names them, and its ``--probe`` asks each backend
which of them answer.
"""

from __future__ import annotations

import json
from typing import NamedTuple

AWAKE = "awake"
_SLEEP_METRIC = "vllm:engine_sleep_state{"
_SLEEP_LABEL = 'sleep_state="'


class OpenRoute(NamedTuple):
    """A vLLM route outside ``/v1`` that no key guards."""

    method: str  # what vLLM serves it for: GET or POST
    path: str
    gate: str  # "always", or the flag or environment variable that turns it on
    acts: bool  # True: it changes the engine or runs the model; False: it only reads


_DEV = "VLLM_SERVER_DEV_MODE=1"
OPEN_ROUTES: tuple[OpenRoute, ...] = (
    OpenRoute("POST", "/invocations", "always", acts=True),
    OpenRoute("POST", "/scale_elastic_ep", "always", acts=True),
    OpenRoute("POST", "/is_scaling_elastic_ep", "always", acts=False),
    OpenRoute("GET", "/kv_event_sources", "always", acts=False),
    OpenRoute("POST", "/tokenize", "always", acts=False),
    OpenRoute("POST", "/detokenize", "always", acts=False),
    OpenRoute("POST", "/start_profile", "--profiler-config", acts=True),
    OpenRoute("POST", "/stop_profile", "--profiler-config", acts=True),
    OpenRoute("GET", "/tokenizer_info", "--enable-tokenizer-info-endpoint", acts=False),
    OpenRoute("POST", "/fault_tolerance/apply", "fault tolerance enabled", acts=True),
    OpenRoute("GET", "/fault_tolerance/status", "fault tolerance enabled", acts=False),
    OpenRoute("POST", "/pause", _DEV, acts=True),
    OpenRoute("POST", "/resume", _DEV, acts=True),
    OpenRoute("POST", "/abort_requests", _DEV, acts=True),
    OpenRoute("POST", "/update_weights", _DEV, acts=True),
    OpenRoute("POST", "/reset_prefix_cache", _DEV, acts=True),
    OpenRoute("POST", "/sleep", _DEV, acts=True),
    OpenRoute("POST", "/wake_up", _DEV, acts=True),
    OpenRoute("POST", "/collective_rpc", _DEV, acts=True),
    OpenRoute("GET", "/is_sleeping", _DEV, acts=False),
    OpenRoute("GET", "/server_info", _DEV, acts=False),
)
"""Every route an audit asks about. ``/health``, ``/ping``, ``/version`` and ``/metrics`` are
open too, on every vLLM, and left out: a gateway needs them and they change nothing."""
ALWAYS_OPEN = ", ".join(route.path for route in OPEN_ROUTES if route.gate == "always")


def route_is_open(status: int | None) -> bool:
    """Whether a keyless ``GET`` answered as an open route does.

    The probe only ever sends ``GET`` (a ``POST`` to ``/sleep`` would put the engine to sleep):
    a ``POST``-only route that exists answers it 405, which is as open as a 200. 401/403 mean
    a key guards it, 404 that the server lacks it; no answer is not open.
    """
    return status is not None and status not in (401, 403, 404)


def model_max_len(body: bytes, model: str) -> int | None:
    """The ``max_model_len`` of ``model``'s card in a ``/v1/models`` answer.

    The card whose ``id`` is ``model``; when none is, the only card there is (a server that
    serves one model under any name). ``None`` when the answer has no such number.
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list):
        return None
    cards = [card for card in cards if isinstance(card, dict)]
    named = [card for card in cards if card.get("id") == model]
    chosen = named[0] if named else cards[0] if len(cards) == 1 else None
    value = chosen.get("max_model_len") if chosen is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def sleep_state(page: str) -> str | None:
    """The engine's sleep state on a vLLM ``/metrics`` page; ``None`` when it is not there.

    ``vllm:engine_sleep_state`` has one sample per state (``awake``, ``weights_offloaded``,
    ``discard_all``) per engine: 1 on the engine's current state, 0 on the others. An engine
    reporting ``awake`` 0 sleeps. With several engines, the first one not awake decides.
    """
    if _SLEEP_METRIC not in page:
        return None
    seen_awake = False
    awake_zero = False
    for line in page.splitlines():
        if not line.startswith(_SLEEP_METRIC):
            continue
        start = line.find(_SLEEP_LABEL)
        close = line.rfind("}")
        if start < 0 or close < start:
            continue
        start += len(_SLEEP_LABEL)
        state = line[start : line.find('"', start)]
        try:
            value = float(line[close + 1 :].split()[0])
        except (ValueError, IndexError):
            continue
        if state != AWAKE and value > 0:
            return state
        if state == AWAKE:
            seen_awake = True
            awake_zero = awake_zero or value == 0
    if awake_zero:
        return "asleep"
    return AWAKE if seen_awake else None
