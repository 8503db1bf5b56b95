"""Reading vLLM's sleep gauge and model cards, and the open-route table (issue 36)."""

from __future__ import annotations

import json

import pytest

from policies.vllm_surface import OPEN_ROUTES, model_max_len, route_is_open, sleep_state


def _gauge(*samples: tuple[str, str, float]) -> str:
    lines = ["# HELP vllm:engine_sleep_state Sleep state.", "# TYPE vllm:engine_sleep_state gauge"]
    for engine, state, value in samples:
        lines.append(
            f'vllm:engine_sleep_state{{engine="{engine}",model_name="m",sleep_state="{state}"}} '
            f"{value}"
        )
    return 'vllm:num_requests_running{engine="0"} 1.0\n' + "\n".join(lines) + "\n"


def test_sleep_state_reads_the_label_set_to_one() -> None:
    """awake 1 is awake; weights_offloaded 1 names that state; no gauge is None."""
    awake = _gauge(("0", "awake", 1), ("0", "weights_offloaded", 0), ("0", "discard_all", 0))
    assert sleep_state(awake) == "awake"
    asleep = _gauge(("0", "awake", 0), ("0", "weights_offloaded", 1), ("0", "discard_all", 0))
    assert sleep_state(asleep) == "weights_offloaded"
    assert sleep_state("vllm:num_requests_running 1.0\n") is None


def test_one_sleeping_engine_of_several_makes_the_server_asleep() -> None:
    """Data-parallel engines: any engine not awake decides; awake 0 alone still means asleep."""
    mixed = _gauge(("0", "awake", 1), ("1", "awake", 0), ("1", "discard_all", 1))
    assert sleep_state(mixed) == "discard_all"
    assert sleep_state(_gauge(("0", "awake", 0))) == "asleep"


def test_sleep_state_survives_junk_lines() -> None:
    """A sample without a value or label is skipped, not fatal."""
    page = 'vllm:engine_sleep_state{engine="0"} 1\nvllm:engine_sleep_state{sleep_state="awake"}\n'
    assert sleep_state(page) is None


def _models(*cards: dict[str, object]) -> bytes:
    return json.dumps({"object": "list", "data": list(cards)}).encode()


def test_model_max_len_takes_the_served_models_card() -> None:
    """The card with the tier's model id; a LoRA adapter beside it does not confuse it."""
    body = _models(
        {"id": "base", "max_model_len": 8192},
        {"id": "adapter", "parent": "base", "max_model_len": 4096},
    )
    assert model_max_len(body, "base") == 8192
    assert model_max_len(body, "adapter") == 4096
    assert model_max_len(body, "other") is None  # two cards, neither named


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        _models({"id": "m"}),
        _models({"id": "m", "max_model_len": True}),
        _models({"id": "m", "max_model_len": -5}),
        _models({"id": "m", "max_model_len": "8192"}),
        json.dumps({"data": "x"}).encode(),
    ],
)
def test_model_max_len_is_none_without_a_usable_number(body: bytes) -> None:
    """Anything but a positive integer in the card leaves the context unknown."""
    assert model_max_len(body, "m") is None


def test_a_single_card_under_another_name_counts() -> None:
    """A server that serves one model under any name (TGI): its only card is the one."""
    assert model_max_len(_models({"id": "tgi", "max_model_len": 2048}), "fast") == 2048


def test_open_route_statuses() -> None:
    """405 to a GET means a POST-only route exists; 401/403/404 and no answer are closed."""
    assert route_is_open(200)
    assert route_is_open(405)
    assert route_is_open(400)
    for closed in (401, 403, 404, None):
        assert not route_is_open(closed)


def test_the_table_has_vllm_033s_always_open_routes() -> None:
    """The routes issue 36 names are in the table, with a method and a gate each."""
    table = {route.path: route for route in OPEN_ROUTES}
    for path in ("/scale_elastic_ep", "/is_scaling_elastic_ep", "/kv_event_sources"):
        assert table[path].gate == "always"
    assert table["/scale_elastic_ep"].acts
    assert not table["/kv_event_sources"].acts
    assert all(route.method in ("GET", "POST") for route in OPEN_ROUTES)
    assert len(table) == len(OPEN_ROUTES)


def test_a_public_backend_finding_names_the_always_open_routes() -> None:
    """check-exposure's upstream_public finding lists vLLM 0.33's always-open routes."""
    from policies.exposure import check_exposure

    findings = check_exposure(
        bind_host="127.0.0.1", tls_in_front=False, backends={"fast": ["http://8.8.8.8:8000"]}
    )
    assert [f.code for f in findings] == ["upstream_public"]
    for path in ("/scale_elastic_ep", "/is_scaling_elastic_ep", "/kv_event_sources"):
        assert path in findings[0].message
