"""vLLM's routes outside /v1 in the simulator: always-open, dev-mode and flag-gated ones, sleep
mode and its gauge, and --api-key with several keys (issue 36)."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from policies.vllm_surface import OPEN_ROUTES, sleep_state
from tests.simulator.procs import REPO_ROOT, SimulatorFactory, SimulatorProcess

_SIMULATED = {
    "/scale_elastic_ep",
    "/is_scaling_elastic_ep",
    "/kv_event_sources",
    "/start_profile",
    "/stop_profile",
    "/tokenizer_info",
    "/fault_tolerance/apply",
    "/fault_tolerance/status",
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/reset_prefix_cache",
    "/server_info",
}


def _status(sim: SimulatorProcess, method: str, path: str) -> int:
    return httpx.request(method, sim.url + path, json={}).status_code


def test_every_route_it_serves_is_in_the_gateways_table(start_simulator: SimulatorFactory) -> None:
    """With every flag on, each simulated open route answers with its table method, keyless."""
    sim = start_simulator(
        "--latency-scale", "0", "--dev-mode", "--enable-gated-routes", "--api-key", "k"
    )
    table = {route.path: route.method for route in OPEN_ROUTES}
    assert table.keys() >= _SIMULATED
    for path in _SIMULATED:
        other = "GET" if table[path] == "POST" else "POST"
        assert _status(sim, other, path) == 405, path  # the route exists, for one method
    assert _status(sim, "POST", "/scale_elastic_ep") == 400  # no new_data_parallel_size
    assert httpx.post(sim.url + "/is_scaling_elastic_ep").json() == {"is_scaling_elastic_ep": False}
    assert httpx.get(sim.url + "/fault_tolerance/status").status_code == 200


def test_routes_follow_version_and_flags(start_simulator: SimulatorFactory) -> None:
    """Elastic EP routes only as vLLM 0.33; sleep only in dev mode; gated ones only on flag."""
    plain = start_simulator("--latency-scale", "0")
    assert _status(plain, "GET", "/kv_event_sources") == 200
    for path in ("/sleep", "/is_sleeping", "/start_profile", "/tokenizer_info"):
        assert _status(plain, "GET", path) == 404, path
    old = start_simulator("--latency-scale", "0", "--vllm-version", "0.11")
    assert _status(old, "GET", "/kv_event_sources") == 404
    assert _status(old, "POST", "/scale_elastic_ep") == 404


def test_sleep_sets_the_gauge_and_refuses_generation(start_simulator: SimulatorFactory) -> None:
    """POST /sleep?level=2: /health 200, gauge discard_all, completions 503; wake_up undoes it."""
    sim = start_simulator("--latency-scale", "0", "--dev-mode")
    assert sleep_state(sim.metrics_text()) == "awake"
    assert httpx.post(sim.url + "/sleep", params={"level": "2"}).status_code == 200
    assert httpx.get(sim.url + "/health").status_code == 200
    assert httpx.get(sim.url + "/is_sleeping").json() == {"is_sleeping": True}
    assert sleep_state(sim.metrics_text()) == "discard_all"
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(
            model="tiergate-fast", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert httpx.post(sim.url + "/sleep", params={"level": "3"}).status_code == 400
    assert httpx.post(sim.url + "/wake_up").status_code == 200
    assert sleep_state(sim.metrics_text()) == "awake"


def test_sim_sleep_control_on_every_flavour(start_simulator: SimulatorFactory) -> None:
    """POST /sim/sleep sets the level without dev mode; a bad body is a 400."""
    sim = start_simulator("--latency-scale", "0")
    answer = httpx.post(sim.url + "/sim/sleep", json={"level": 1})
    assert answer.json() == {"sleep_level": 1, "sleep_state": "weights_offloaded"}
    assert sim.stats()["sleep_level"] == 1
    assert sleep_state(sim.metrics_text()) == "weights_offloaded"
    for bad in ({"level": 5}, {"level": "1"}, [1]):
        assert httpx.post(sim.url + "/sim/sleep", json=bad).status_code == 400
    assert httpx.post(sim.url + "/sim/sleep", json={"level": 0}).status_code == 200


def test_several_api_keys_are_each_accepted(start_simulator: SimulatorFactory) -> None:
    """--api-key old new: either key opens /v1; any other is 401, as vLLM's key list."""
    sim = start_simulator("--latency-scale", "0", "--api-key", "old", "new")
    for key, status in (("old", 200), ("new", 200), ("other", 401)):
        answer = httpx.get(sim.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == status, key


def test_vllm_api_key_is_read_when_the_flag_is_absent() -> None:
    """VLLM_API_KEY guards /v1 as vLLM reads it when --api-key is not given."""
    env = {**os.environ, "VLLM_API_KEY": "from-env"}
    command = [sys.executable, "-m", "simulator", "--port", "0", "--latency-scale", "0"]
    proc = subprocess.Popen(  # our own module, arguments we built
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        assert httpx.get(url + "/v1/models").status_code == 401
        ok = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer from-env"})
        assert ok.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
