"""Attacks on wave-limits, wave-shadow and wave-deploy (review of today's merges, round 6).

* A key with a precise-share cap (downgrade) and a budget its request fits on fast but not on
  precise: while the cap's window still lets it go precise the budget refuses it with
  ``x-should-retry: false``, yet the same request is served once the window moves it to fast.
* The Redis password as the deployments hand it over: Redis takes it through a shell's
  ``$(cat FILE)`` (compose: trailing newlines dropped, nothing else) or the kubelet's
  ``$(REDIS_PASSWORD)`` (the chart: the Secret's bytes, a trailing newline included, as
  ``kubectl create secret --from-file`` of an ``echo``-made file gives), the gateway from the
  same secret as a file. Both sides must make the same password of it, or Redis is ready (its
  probe authenticates) while every gateway call is refused.
* A corrupt or hostile shadow store: ``--from-shadow`` validated a record's ``judge`` and
  ``tenant`` but read its ``agreement`` with ``float()`` (NaN, 1e300, ``true``, ``"0.9"``
  taken as labels) and let a missing field end the run with a bare ``KeyError`` naming no
  record.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.exceptions
import yaml

from router_models.records import RecordError
from router_models.training.shadow_train import read_shadow
from tests.adversarial.test_attack_today5 import configure_redis
from tests.deploy import chart_render
from tests.deploy.compose_file import environment_of, interpolate, load_compose
from tests.deploy.test_redis_password import gateway_config
from tests.deploy.test_redis_password_live import (
    CONFIGS,
    _expand,
    _gateway_pings,
    _health,
    _redis,
    _shell_append,
    _stranger_pings,
)
from tests.integration.test_budgets_usage import new_key
from tests.router_models.test_shadow_train import SIMPLE, record, write_store
from tests.stack import FAST_SIM, Stack, running_stack

pytestmark = pytest.mark.slow  # real processes: make test-all and CI


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Redis, a fast simulator, one gateway with keys, limits and budgets on Redis."""
    with running_stack(sims=[FAST_SIM], redis=True, configure=configure_redis) as up:
        yield up


def test_a_budget_refusal_the_precise_cap_cures_is_not_final(stack: Stack) -> None:
    """Budget 0.05 a day, precise share capped at 0.5 (downgrade): ``model: precise`` with
    100 tokens costs about 0.1 on precise (more than the whole budget), 0.026 on fast. Sent
    again and again, the cap moves it to fast and it is served: no refusal before that may
    tell the client never to retry it."""
    _, token = asyncio.run(new_key(stack.redis_url, budget_daily=0.05, max_precise_share=0.5))
    body = {"model": "precise", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    url, auth = stack.gateway.url + "/v1/chat/completions", {"authorization": f"Bearer {token}"}
    answers = [httpx.post(url, headers=auth, json=body, timeout=30.0) for _ in range(4)]
    statuses = [(a.status_code, a.headers.get("x-should-retry")) for a in answers]
    assert any(a.status_code == 200 for a in answers), statuses  # the cap's move cures it
    finals = [a for a in answers if a.headers.get("x-should-retry") == "false"]
    assert not finals, (statuses, finals[0].json())


@pytest.mark.parametrize("capped", [False, True])
def test_never_fitting_refusals_give_back_the_rpm_and_the_slot(stack: Stack, capped: bool) -> None:
    """Held: rpm 2, one request in flight, budget 0.02 a day. Five requests dearer than the
    whole budget (300 tokens on fast, about 0.077) are refused as final before the limits'
    verdict; each must give the request and the slot back, so two that fit are then served
    (with a precise-share cap too, whose path awaits the limits before its window)."""
    share = 0.5 if capped else None
    _, token = asyncio.run(
        new_key(
            stack.redis_url, rpm=2, max_concurrency=1, budget_daily=0.02, max_precise_share=share
        )
    )
    url, auth = stack.gateway.url + "/v1/chat/completions", {"authorization": f"Bearer {token}"}

    def body(max_tokens: int) -> dict[str, Any]:
        return {
            "model": "fast",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        }

    refused = [httpx.post(url, headers=auth, json=body(300), timeout=30.0) for _ in range(5)]
    assert [(r.status_code, r.headers.get("x-should-retry")) for r in refused] == [
        (429, "false")
    ] * 5
    served = [httpx.post(url, headers=auth, json=body(5), timeout=30.0) for _ in range(2)]
    assert [r.status_code for r in served] == [200, 200], [r.text for r in served]


# Every character a URL would have to escape, and a trailing space a strip would lose.
ODD_PASSWORD = "p@ss:w/rd%40#?&= "


def test_compose_redis_and_the_gateway_agree_on_an_odd_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compose's Redis command and the gateway's config, one secret file (written by an
    editor: a trailing newline)."""
    compose = load_compose()
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "redis_password").write_text(ODD_PASSWORD + "\n", encoding="utf-8")

    def here(text: str) -> str:
        return text.replace("/run/secrets/", f"{secrets}/")

    redis_service = compose["services"]["redis"]
    argv = _shell_append([here(part) for part in interpolate(redis_service["command"])])
    with _redis(argv, dict(os.environ), tmp_path) as port:
        local = f"redis://127.0.0.1:{port}/0"
        for key, value in environment_of(compose["services"]["gateway"]).items():
            if value is not None:
                monkeypatch.setenv(key, here(interpolate(value)))
        config = tmp_path / "tiergate.yaml"
        text = CONFIGS["gateway"].read_text(encoding="utf-8")
        config.write_text(text.replace("redis://redis:6379/0", local), encoding="utf-8")
        assert _gateway_pings(config)


def test_chart_redis_and_the_gateway_agree_on_a_secret_ending_in_a_newline(
    tmp_path: Path,
) -> None:
    """The chart's Redis args and probe with a Secret (``redis.auth.existingSecret``) whose
    value ends in a newline, and the gateway reading the same Secret mounted as a file."""
    objects = chart_render.objects(chart_render.render(None))
    (template,) = [
        t
        for _, t in chart_render.pod_templates(objects)
        if t["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"
    ]
    container = template["spec"]["containers"][0]
    secret_value = "from-kubectl-create-secret\n"
    env = dict(os.environ)
    for item in container["env"]:
        env[item["name"]] = secret_value  # what the kubelet puts there from the Secret
    argv = _shell_append([_expand(arg, env) for arg in container["args"]])
    with _redis(argv, env, tmp_path) as port:
        local = f"redis://127.0.0.1:{port}/0"
        with pytest.raises(redis.exceptions.RedisError):
            _stranger_pings(local)
        assert _health(container["readinessProbe"]["exec"]["command"][-1], port, env) == 0
        secret_file = tmp_path / "password"
        secret_file.write_text(secret_value, encoding="utf-8")  # the Secret, mounted
        config = gateway_config(objects)
        config["redis"] = {**config["redis"], "url": local, "password_file": str(secret_file)}
        config_path = tmp_path / "tiergate.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        assert _gateway_pings(config_path)  # ready Redis, and the gateway gets in too


def _without(record: dict[str, Any], *path: str) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(record))
    *parents, last = path
    where = copy
    for part in parents:
        where = where[part]
    del where[last]
    return copy


@pytest.mark.parametrize(
    "bad",
    [
        {"agreement": math.nan},
        {"agreement": 1e300},
        {"agreement": -5.0},
        {"agreement": True},
        {"agreement": "0.9"},
        {"agreement": None},
        {"prompt_digest": 7},
        {"features": {"index": [1, "x"], "value": [1.0, 1.0]}},
        {"features": {"index": [1, 2], "value": [1.0]}},
        {"features": {"index": [-1], "value": [1.0]}},
        "agreement",
        "prompt_digest",
        "features.index",
    ],
)
def test_a_corrupt_shadow_record_is_refused_with_its_place(
    tmp_path: Path, bad: dict[str, Any] | str
) -> None:
    """One good record, then a corrupt one: the reader refuses the store with a RecordError
    that names the file and line (the CLI prints it and exits 2), never trains on it."""
    good = record(SIMPLE[0], 1.0)
    corrupt = _without(good, *bad.split(".")) if isinstance(bad, str) else good | bad
    store = write_store(tmp_path / "s.jsonl", [good, corrupt])
    with pytest.raises(RecordError, match=r"s\.jsonl:2"):
        read_shadow([store])
