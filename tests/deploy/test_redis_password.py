"""Redis in every shipped deployment requires a password that lives only in a secret.

Before: compose and the chart ran `redis-server --protected-mode no` with no password, so
anything that got onto Redis's network (a NetworkPolicy the CNI ignores, a container joined to
the `state` network) could read and rewrite the rate limits, budgets and Redis-stored keys.
Here the chart and compose files are read as data; tests/deploy/test_redis_password_live.py
starts a real redis-server with the very commands they give it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import yaml

from tests.deploy import chart_render
from tests.deploy.chart_render import of_kind, pod_templates
from tests.deploy.compose_file import environment_of, interpolate

SECRET_FILE = "/run/secrets/redis_password"


def _container(items: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (template,) = [
        t
        for _, t in pod_templates(items)
        if t["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    container: dict[str, Any] = template["spec"]["containers"][0]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in container.get("env") or []}


def redis_secret_ref(items: list[dict[str, Any]]) -> dict[str, str]:
    """The secretKeyRef the in-chart Redis reads its password from."""
    ref: dict[str, str] = _env(_container(items, "redis"))["REDIS_PASSWORD"]["valueFrom"][
        "secretKeyRef"
    ]
    return ref


def chart_password(items: list[dict[str, Any]]) -> str:
    """The password the chart generated (decoded from its Secret)."""
    ref = redis_secret_ref(items)
    (secret,) = [s for s in of_kind(items, "Secret") if s["metadata"]["name"] == ref["name"]]
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def gateway_password_path(items: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(path of the password file in the gateway pod, the volume it comes from)."""
    (deployment,) = [
        d
        for d in of_kind(items, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    ]
    spec = deployment["spec"]["template"]["spec"]
    config = gateway_config(items)
    path: str = config["redis"]["password_file"]
    (mount,) = [
        m
        for m in spec["containers"][0]["volumeMounts"]
        if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return path, volume


def gateway_config(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The gateway's configuration file, as the ConfigMap holds it."""
    (config_map,) = [c for c in of_kind(items, "ConfigMap") if "tiergate.yaml" in c["data"]]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["tiergate.yaml"])
    return config


def test_the_in_chart_redis_requires_a_generated_password_from_a_secret(
    any_objects: list[dict[str, Any]],
) -> None:
    """requirepass comes from a Secret through the environment; probes authenticate."""
    redis = _container(any_objects, "redis")
    assert redis["args"][:2] == ["sh", "-c"]  # trailing newlines dropped, as the gateway does
    assert '--requirepass "$$(printf \'%s\' "$REDIS_PASSWORD")"' in redis["args"][2]
    ref = redis_secret_ref(any_objects)
    assert _env(redis)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref
    assert _env(redis)["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"] == ref
    for probe in ("readinessProbe", "livenessProbe"):
        command = " ".join(redis[probe]["exec"]["command"])
        assert "redis-cli" in command
        assert "PONG" in command  # redis-cli exits 0 on a NOAUTH reply: the answer is checked
    password = chart_password(any_objects)
    assert len(password) >= 32
    assert re.fullmatch(r"[A-Za-z0-9]+", password)


def test_the_gateway_reads_the_redis_password_from_the_same_secret_as_a_file(
    any_objects: list[dict[str, Any]],
) -> None:
    """The ConfigMap names a file (no password, no credentials in redis.url); the file is the
    Secret's key mounted read-only into the gateway pod."""
    config = gateway_config(any_objects)
    assert "@" not in config["redis"]["url"]
    path, volume = gateway_password_path(any_objects)
    ref = redis_secret_ref(any_objects)
    assert volume["secret"]["secretName"] == ref["name"]
    (item,) = volume["secret"]["items"]
    assert item["key"] == ref["key"]
    assert path.endswith("/" + item["path"])


def test_the_generated_password_appears_in_no_object_but_its_secret(
    any_objects: list[dict[str, Any]], default_render: dict[str, str]
) -> None:
    """Not in a ConfigMap, a Deployment's spec, NOTES or anything else."""
    password = chart_password(any_objects)
    ref = redis_secret_ref(any_objects)
    for item in any_objects:
        if item["kind"] == "Secret" and item["metadata"]["name"] == ref["name"]:
            continue
        assert password not in json.dumps(item), item["metadata"]["name"]
    assert "no password" not in default_render["tiergate/templates/NOTES.txt"]


def test_an_existing_secret_replaces_the_generated_one() -> None:
    """redis.auth.existingSecret: the chart generates no Redis Secret and reads the named one."""
    values = {"redis": {"auth": {"existingSecret": "redis-auth", "existingSecretKey": "pw"}}}
    items = chart_render.objects(chart_render.render(values))
    assert redis_secret_ref(items) == {"name": "redis-auth", "key": "pw"}
    _, volume = gateway_password_path(items)
    assert volume["secret"]["secretName"] == "redis-auth"
    assert [s["metadata"]["name"] for s in of_kind(items, "Secret")] == ["tg-tiergate-secrets"]


def test_compose_redis_requires_the_password_file(compose: dict[str, Any]) -> None:
    """Redis reads requirepass from a compose secret file; its health check authenticates."""
    redis = compose["services"]["redis"]
    assert "redis_password" in redis["secrets"]
    command = " ".join(interpolate(redis["command"]))
    assert "--requirepass" in command
    assert f"$(cat {SECRET_FILE})" in command
    health = " ".join(interpolate(redis["healthcheck"]["test"]))
    assert f"$(cat {SECRET_FILE})" in health
    assert "PONG" in health
    assert compose["secrets"]["redis_password"]["file"].endswith("/redis-password")


def test_compose_gateways_read_the_same_file_and_no_url_holds_a_password(
    compose: dict[str, Any],
) -> None:
    """Both gateways mount the secret and name it in TIERGATE_REDIS__PASSWORD_FILE."""
    for name in ("gateway", "gateway-sim"):
        service = compose["services"][name]
        assert "redis_password" in service["secrets"]
        env = environment_of(service)
        assert env["TIERGATE_REDIS__PASSWORD_FILE"] == SECRET_FILE
        for value in env.values():
            assert not re.search(r"redis://[^/]*@", value or ""), value


def test_both_pods_roll_when_the_generated_password_changes(
    any_objects: list[dict[str, Any]],
) -> None:
    """The gateway's and Redis's pod templates carry the same checksum of the password (one
    value per render), so a new password never meets a pod that still holds the old one."""
    wanted = hashlib.sha256(chart_password(any_objects).encode()).hexdigest()
    checksums = {
        t["metadata"]["labels"]["app.kubernetes.io/component"]: t["metadata"]["annotations"][
            "checksum/redis-auth"
        ]
        for _, t in pod_templates(any_objects)
        if t["metadata"]["labels"]["app.kubernetes.io/component"] in {"gateway", "redis"}
    }
    assert checksums == {"gateway": wanted, "redis": wanted}


def test_a_chosen_key_name_is_used_by_the_generated_secret_too() -> None:
    """redis.auth.existingSecretKey alone names the key of the Secret the chart makes."""
    items = chart_render.objects(
        chart_render.render({"redis": {"auth": {"existingSecretKey": "k"}}})
    )
    assert redis_secret_ref(items) == {"name": "tg-tiergate-redis-auth", "key": "k"}
    assert len(chart_password(items)) == 40
