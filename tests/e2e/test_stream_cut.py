"""Issue 24's table against real llama-cpp-python servers run as their docs show them.

The servers keep their own default ``--interrupt_requests True``: a request that waits for the
model makes the running stream end with ``[DONE]`` and no ``finish_reason``. The gateway used
to send such requests itself (a ``/v1/models`` probe, a detection round), so callers got
answers cut short with a 200 and ``outcome: complete``. Every configuration of the issue's
table streams three answers through the official client and must get all 24 tokens each.

``TIERGATE_CUT_TABLE=path`` also writes the table (characters / completion tokens per stream)
to ``path``: ``make stream-cut-table`` writes bench/results/stream-cut-llamacpp.md.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ADMIN_TOKEN, FAST_MODEL, PRECISE_MODEL, llama
from tests.e2e.llama_server import LlamaServer
from tests.integration.gateway_proc import GatewayProcess

TOKENS = 24
PROMPT = "Write a Python function that reverses a list."
Row = list[tuple[int, int, str | None]]
_table: dict[str, Row] = {}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[LlamaServer, LlamaServer]]:
    """Two llama-cpp-python servers on their defaults (interrupt_requests on), n_ctx 2048."""
    options: dict[str, Any] = {"interrupt_requests": True, "context_tokens": 2048}
    with llama(FAST_MODEL, **options) as fast, llama(PRECISE_MODEL, **options) as precise:
        yield fast, precise
    target = os.environ.get("TIERGATE_CUT_TABLE")
    if target:
        _write_table(Path(target))


def _config(servers: tuple[LlamaServer, LlamaServer], **tier: Any) -> dict[str, Any]:
    fast, precise = servers
    timeouts = {"timeouts": {"first_byte_s": 60, "idle_s": 30}}
    return {
        "auth": {"enabled": False, "admin_token": ADMIN_TOKEN},
        "telemetry": {"log_format": "json"},
        "tiers": {
            "fast": {"model": FAST_MODEL, "replicas": [fast.url], **timeouts, **tier},
            "precise": {"model": PRECISE_MODEL, "replicas": [precise.url], **timeouts, **tier},
        },
    }


def _ready(gw: GatewayProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(gw.url + "/readyz", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, gw.log_text()
        time.sleep(0.2)


def _stream(gw: GatewayProcess) -> tuple[int, int, str | None]:
    """One streamed answer at temperature 0: characters, completion tokens, finish reason."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    chars, completion, finish = 0, -1, None
    for chunk in client.chat.completions.create(
        model="precise",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            completion = chunk.usage.completion_tokens
        for choice in chunk.choices:
            chars += len(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return chars, completion, finish


def _check(name: str, row: Row) -> None:
    _table[name] = row
    assert [(tokens, finish) for _, tokens, finish in row] == [(TOKENS, "length")] * 3, row


def test_models_health_path(servers: tuple[LlamaServer, LlamaServer]) -> None:
    """health_path /v1/models on both tiers: three streams of 24 tokens."""
    with GatewayProcess(_config(servers, health_path="/v1/models")) as gw:
        _ready(gw)
        _check("`health_path: /v1/models` on both tiers", [_stream(gw) for _ in range(3)])


def test_models_health_path_after_a_non_streamed_request(
    servers: tuple[LlamaServer, LlamaServer],
) -> None:
    """The same right after one non-streamed model=auto request."""
    with GatewayProcess(_config(servers, health_path="/v1/models")) as gw:
        _ready(gw)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS
        )
        _check(
            "same, right after one non-streamed `model: auto` request",
            [_stream(gw) for _ in range(3)],
        )


def test_auto_detected_kind(servers: tuple[LlamaServer, LlamaServer]) -> None:
    """No health_path (the kind detected): three streams of 24 tokens."""
    with GatewayProcess(_config(servers)) as gw:
        _ready(gw)
        _check("no `health_path` (auto-detected kind)", [_stream(gw) for _ in range(3)])


def test_a_second_gateway_beside(servers: tuple[LlamaServer, LlamaServer]) -> None:
    """A second gateway (auto) starts and detects the servers while the first streams."""
    with GatewayProcess(_config(servers)) as gw:
        _ready(gw)
        row: Row = []
        worker = threading.Thread(target=lambda: row.extend(_stream(gw) for _ in range(3)))
        worker.start()
        with GatewayProcess(_config(servers)) as second:
            _ready(second)
            worker.join(timeout=300)
        _check("a second gateway (auto-detected kind) starting beside the first", row)


def test_n_2_is_one_whole_choice(servers: tuple[LlamaServer, LlamaServer]) -> None:
    """llama-cpp-python drops ``n``: a stream asking n=2 gets its one choice whole, no error."""
    with GatewayProcess(_config(servers)) as gw:
        _ready(gw)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        finishes: dict[int, str | None] = {}
        for chunk in client.chat.completions.create(
            model="precise",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=TOKENS,
            n=2,
            stream=True,
        ):
            for choice in chunk.choices:
                finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
        assert finishes == {0: "length"}


def _write_table(path: Path) -> None:
    lines = [
        "# Issue 24's table, re-run: real llama-cpp-python servers on their defaults",
        "",
        "Command: `make stream-cut-table` (tests/e2e/test_stream_cut.py; SmolLM2-135M Q4 GGUF,",
        f"`--n_ctx 2048`, interrupt_requests on; `model: precise`, `max_tokens: {TOKENS}`,",
        "temperature 0, the official openai client with `include_usage`).",
        "",
        "| gateway config | three streams in a row: characters / completion_tokens / finish |",
        "|---|---|",
    ]
    for name, row in _table.items():
        cells = ", ".join(f"{chars} / {tokens} / {finish}" for chars, tokens, finish in row)
        lines.append(f"| {name} | {cells} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
