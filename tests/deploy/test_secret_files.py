"""The secret files' permissions: docs/deployment.md's first advice keeps the admin token, keys
file and Grafana password readable by their container's user only; the uids it names are the
ones the image, compose and the chart run as; the chart mounts no secret world-readable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.deploy.chart_render import of_kind

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8")
GATEWAY_UID = "10001"
GRAFANA_UID = "472"  # the grafana/grafana image's user (compose sets no other)
REDIS_PASSWORD = "deploy/secrets/redis-password"


def _setup_block() -> str:
    """The shell block of the Docker Compose section that creates the secret files."""
    section = DOC.split("## Docker Compose", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    (block,) = [str(b) for b in blocks if "deploy/secrets/admin-token" in b]
    return block


def _commands(block: str, verb: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if verb in line]


def test_the_default_advice_is_owner_only() -> None:
    """No chmod in the setup block grants 'others' anything; each secret is chowned to its
    container's uid and made 0400 or 0600."""
    block = _setup_block()
    chmods = [cmd for cmd in _commands(block, "chmod ") if REDIS_PASSWORD not in cmd]
    modes = [m for cmd in chmods for m in re.findall(r"\b0?([0-7]{3})\b", cmd)]
    assert modes, block
    assert all(mode[-1] == "0" for mode in modes), modes
    assert all(mode in {"400", "600"} for mode in modes), modes
    chowns = " ".join(_commands(block, "chown "))
    gateway = re.search(rf"chown {GATEWAY_UID}(?::{GATEWAY_UID})? ([^;&|]+)", chowns)
    assert gateway is not None, chowns
    assert {"deploy/secrets/keys.yaml", "deploy/secrets/admin-token"} <= set(gateway[1].split())
    grafana = re.search(rf"chown {GRAFANA_UID}(?::\d+)? ([^;&|]+)", chowns)
    assert grafana is not None, chowns
    assert "deploy/secrets/grafana-admin-password" in grafana[1].split()
    assert "0644" not in DOC


def test_the_redis_password_is_read_by_the_gateway_and_redis_only(
    compose: dict[str, Any],
) -> None:
    """Two containers read the Redis password: the gateway (uid 10001, the owner) and Redis
    (uid 999, in group 10001 through group_add); 0440 gives nobody else anything."""
    block = _setup_block()
    assert "token_urlsafe" in " ".join(_commands(block, REDIS_PASSWORD))
    (chown,) = [c for c in _commands(block, "chown ") if REDIS_PASSWORD in c]
    assert f"chown {GATEWAY_UID}:{GATEWAY_UID} " in chown
    (chmod,) = [c for c in _commands(block, "chmod ") if REDIS_PASSWORD in c]
    assert re.search(r"chmod 0?440 ", chmod), chmod
    redis = compose["services"]["redis"]
    assert [str(g) for g in redis["group_add"]] == [GATEWAY_UID]
    assert redis["user"] == "999:1000"


def test_the_shared_host_variant_comes_second_and_stays_out_of_reach_of_others() -> None:
    """A group-readable variant follows the default, and grants 'others' nothing either."""
    section = DOC.split("## Docker Compose", 1)[1].split("\n## ", 1)[0]
    default_at = section.index(_setup_block())
    variant = section[default_at + len(_setup_block()) :]
    modes = re.findall(r"chmod (?:[a-z]+=?[a-z]*,?)*\s*0?([0-7]{3})\b", variant)
    assert modes, variant[:600]
    assert all(mode[-1] == "0" for mode in modes), modes


def test_the_uids_the_doc_names_are_the_ones_that_run(compose: dict[str, Any]) -> None:
    """The image runs as 10001, compose overrides neither the gateway's nor Grafana's user."""
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(rf"^USER {GATEWAY_UID}:{GATEWAY_UID}$", dockerfile, flags=re.MULTILINE)
    for name, service in compose["services"].items():
        if name.startswith("gateway") or name == "grafana":
            assert service.get("user") in (None, f"{GATEWAY_UID}:{GATEWAY_UID}"), name
    assert f"uid {GATEWAY_UID} (gateway) and {GRAFANA_UID} (Grafana)" in " ".join(DOC.split())


def test_the_chart_mounts_secrets_without_world_read(
    everything_objects: list[dict[str, Any]],
) -> None:
    """The gateway pod runs as 10001 and its secret volume's mode gives 'others' nothing."""
    (pod,) = [
        d["spec"]["template"]["spec"]
        for d in of_kind(everything_objects, "Deployment")
        if any(c["name"] == "gateway" for c in d["spec"]["template"]["spec"]["containers"])
    ]
    assert str(pod["securityContext"]["runAsUser"]) == GATEWAY_UID
    secrets = [v["secret"] for v in pod["volumes"] if "secret" in v]
    assert secrets
    for secret in secrets:
        assert secret["defaultMode"] & 0o007 == 0, oct(secret["defaultMode"])
