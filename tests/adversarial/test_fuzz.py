"""A bounded property-based fuzz of the two inference endpoints' request bodies.

Against a real gateway (with keys) and a real simulator: whatever the body, the answer is
never a 500, every error is OpenAI-shaped, and the gateway is healthy afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
PATHS = ("/v1/chat/completions", "/v1/completions")

scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "temperature",
        "top_p",
        "stop",
        "tools",
        "response_format",
        "stream_options",
        "seed",
        "logit_bias",
        "top_k",
        "best_of",
        "echo",
        "priority",
        "user",
        "metadata",
    ]
) | st.text(max_size=10)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", ""])},
        optional={"content": json_values | st.text(max_size=60)},
    ),
    max_size=3,
)
near_valid = st.fixed_dictionaries(
    {"model": st.sampled_from(["fast", "precise", "auto", "tiergate-fast", "nope", ""])},
    optional={
        "messages": messages,
        "prompt": json_values | st.text(max_size=60),
        "max_tokens": st.integers(-5, 10_000) | json_values,
        "stream": st.booleans() | json_values,
    },
).flatmap(
    lambda base: st.dictionaries(field_names, json_values, max_size=3).map(
        lambda extra: {**base, **extra}
    )
)
bodies = (
    near_valid.map(lambda b: json.dumps(b, allow_nan=True).encode())
    | json_values.map(lambda v: json.dumps(v, allow_nan=True).encode())
    | st.binary(max_size=200)
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    """(a client of a gateway with one key, in front of one simulator; that key).

    One client for every example: a new ``httpx.Client`` costs 20-60 ms (its TLS context
    loads the CA bundle), more than the request itself. The connection it keeps alive is
    reused after error answers too, as a real client's is."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    record, key = issue_key("fuzz", KeyPolicy(), now=time.time())
    FileKeyStore(path).put_sync(record)
    with SimulatorProcess(
        "--profile",
        "fast",
        "--model",
        "tiergate-fast",
        "--latency-scale",
        "0",
        "--max-model-len",
        "4096",
    ) as sim:
        config = {
            "auth": {"keys_file": str(path)},
            "tiers": tiers_config([sim.url], [sim.url], max_tokens_cap=64),
        }
        with (
            GatewayProcess(config) as gateway,
            httpx.Client(base_url=gateway.url, timeout=15) as client,
        ):
            yield client, key
            assert httpx.get(gateway.url + "/livez", timeout=5).status_code == 200


def assert_openai_error(resp: httpx.Response) -> None:
    """An error body shaped like OpenAI's."""
    error = resp.json()["error"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["type"], str)
    assert "param" in error
    assert "code" in error


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.sampled_from(PATHS), raw=bodies)
def test_no_body_makes_a_500(target: tuple[httpx.Client, str], path: str, raw: bytes) -> None:
    """Any body: a status below 500 (or a 502/503/504 naming the backend), never a 500."""
    client, key = target
    resp = client.post(
        path,
        content=raw,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert resp.status_code != 500, resp.text
    if resp.status_code >= 400:
        assert_openai_error(resp)
    else:
        data: Any = resp.json() if "json" in resp.headers.get("content-type", "") else None
        assert data is None or isinstance(data, dict)
