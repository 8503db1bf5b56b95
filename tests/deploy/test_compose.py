"""compose.yaml keeps inference ports locked down, and its sim profile runs without GPUs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.compose_file import (
    COMPOSE_PATH,
    REPO,
    duration_seconds,
    environment_of,
    interpolate,
    networks_of,
    services_for,
)

BIN = Path(sys.executable).parent
BACKENDS = ("vllm-fast", "vllm-precise", "sim-fast", "sim-precise", "redis")
GATEWAYS = {"gpu": "gateway", "sim": "gateway-sim"}
SECRET_NAME = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|APIKEY|CREDENTIAL", re.IGNORECASE)
CONFIG_PATH = "/etc/tiergate/tiergate.yaml"


def _config_source(compose: dict[str, Any], service: str) -> str:
    """The host file a gateway service mounts as its --config file."""
    spec = compose["services"][service]
    assert spec["command"][spec["command"].index("--config") + 1] == CONFIG_PATH
    (mount,) = [c for c in spec["configs"] if c["target"] == CONFIG_PATH]
    return str(compose["configs"][mount["source"]]["file"])


def _load_config(path: str) -> dict[str, Any]:
    data = yaml.safe_load((REPO / path).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_compose_file_matches_the_compose_specification() -> None:
    """check-jsonschema validates compose.yaml against its bundled compose-spec schema offline."""
    result = subprocess.run(
        [
            str(BIN / "check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE_PATH),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validation done" in result.stdout


def test_check_jsonschema_rejects_a_broken_compose_file(tmp_path: Path) -> None:
    """The schema check is real: a service with an unknown key fails it."""
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  a:\n    image: x\n    portz: ['80:80']\n", encoding="utf-8")
    result = subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1


@pytest.mark.parametrize("name", BACKENDS)
def test_backends_publish_nothing_and_sit_only_on_internal_networks(
    compose: dict[str, Any], name: str
) -> None:
    """vLLM, the simulators and Redis have no ports and join only internal networks."""
    service = compose["services"][name]
    assert "ports" not in service
    assert "expose" not in service
    assert service.get("network_mode") is None
    for network in networks_of(service):
        assert compose["networks"][network].get("internal") is True, network


def test_only_gateways_and_loopback_uis_publish_ports(compose: dict[str, Any]) -> None:
    """A published port is either a gateway's or bound literally to 127.0.0.1."""
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert isinstance(port, dict), f"{name}: use the long port syntax with host_ip"
            if name in GATEWAYS.values():
                assert port["host_ip"] == "${TIERGATE_PUBLISH_ADDRESS:-127.0.0.1}"
            else:
                assert port["host_ip"] == "127.0.0.1", name


@pytest.mark.parametrize("gateway", GATEWAYS.values())
def test_gateway_is_published_on_loopback_by_default(compose: dict[str, Any], gateway: str) -> None:
    """With no variables set the gateway listens on 127.0.0.1:8080; a variable opens it up."""
    (port,) = compose["services"][gateway]["ports"]
    assert interpolate(port["host_ip"]) == "127.0.0.1"
    assert interpolate(port["published"]) == "8080"
    assert port["target"] == 8080
    opened = interpolate(port["host_ip"], {"TIERGATE_PUBLISH_ADDRESS": "0.0.0.0"})
    assert opened == "0.0.0.0"


@pytest.mark.parametrize("gateway", GATEWAYS.values())
def test_gateway_container_is_hardened(compose: dict[str, Any], gateway: str) -> None:
    """The gateway runs read-only, without capabilities, with a health check on /livez."""
    service = compose["services"][gateway]
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in service["security_opt"]
    assert "/livez" in " ".join(service["healthcheck"]["test"])
    assert set(networks_of(service)) == {"edge", "inference", "state", "telemetry"}


def test_internal_networks_are_internal_and_edge_is_not(compose: dict[str, Any]) -> None:
    """inference, state and telemetry are internal; only edge can publish and reach out."""
    networks = compose["networks"]
    assert {n for n, spec in networks.items() if (spec or {}).get("internal")} == {
        "inference",
        "state",
        "telemetry",
    }
    assert not (networks["edge"] or {}).get("internal")


@pytest.mark.parametrize("network", ["inference", "state", "telemetry"])
def test_the_host_has_no_address_on_the_internal_networks(
    compose: dict[str, Any], network: str
) -> None:
    """`internal: true` stops traffic leaving a network, not the host entering it: on a Linux
    Docker host the bridge of an internal network still gets the network's gateway address
    (moby restored that in 25.0.x), so any local user reaches vLLM, Redis or the metrics port
    by container IP. With inhibit_ipv4 the bridge has no IPv4 address: the host has no route
    into the subnet, and the containers on it still reach each other over the bridge."""
    options = compose["networks"][network].get("driver_opts") or {}
    assert options.get("com.docker.network.bridge.inhibit_ipv4") == "true"


def test_only_the_gateway_reaches_the_backends(compose: dict[str, Any]) -> None:
    """Nothing but gateways and backends joins the inference and state networks."""
    for name, service in compose["services"].items():
        joined = set(networks_of(service)) & {"inference", "state"}
        if joined:
            assert name in GATEWAYS.values() or name in BACKENDS, name


@pytest.mark.parametrize("name", [*BACKENDS, *GATEWAYS.values(), "prometheus", "grafana"])
def test_services_have_health_checks(compose: dict[str, Any], name: str) -> None:
    """Every service whose image can run a probe has a health check."""
    check = compose["services"][name]["healthcheck"]
    assert check["test"][0] == "CMD"
    assert duration_seconds(check["interval"]) > 0


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("vllm-fast", ["--quantization", "--dtype"]),
        ("vllm-precise", ["--dtype"]),
    ],
)
def test_vllm_services_serve_the_documented_models_on_a_gpu(
    compose: dict[str, Any], name: str, flags: list[str]
) -> None:
    """vLLM runs with prefix caching and cached-token reporting, a GPU and named models."""
    service = compose["services"][name]
    command = service["command"]
    assert "--enable-prefix-caching" in command
    assert "--enable-prompt-tokens-details" in command
    assert all(flag in command for flag in flags)
    assert command[0].startswith("${TIERGATE_")
    served = command[command.index("--served-model-name") + 1]
    assert re.fullmatch(r"\$\{TIERGATE_\w+:-[\w.-]+\}", served)
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert device["driver"] == "nvidia"
    assert service["environment"]["HF_HUB_OFFLINE"] == "1"
    assert service["profiles"] == ["gpu"]


def test_default_models_are_int4_fast_and_fp16_precise(compose: dict[str, Any]) -> None:
    """By default the fast tier is an AWQ build and the precise tier the same model in FP16."""
    fast = interpolate(compose["services"]["vllm-fast"]["command"])
    precise = interpolate(compose["services"]["vllm-precise"]["command"])
    assert fast[0] == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    assert fast[fast.index("--quantization") + 1].startswith("awq")
    assert precise[0] == "Qwen/Qwen2.5-7B-Instruct"
    assert precise[precise.index("--dtype") + 1] == "float16"


def test_gpu_gateway_asks_for_the_names_vllm_serves(compose: dict[str, Any]) -> None:
    """The GPU config's tier models and vLLM's --served-model-name come from the same variables."""
    config = _load_config(_config_source(compose, "gateway"))
    env = environment_of(compose["services"]["gateway"])
    for tier, service in (("fast", "vllm-fast"), ("precise", "vllm-precise")):
        command = compose["services"][service]["command"]
        served = command[command.index("--served-model-name") + 1]
        variable = re.fullmatch(r"\$\{(\w+):-([^}]*)\}", served)
        assert variable is not None
        assert env[variable.group(1)] == served
        assert config["tiers"][tier]["model"] == served
        assert config["tiers"][tier]["replicas"] == [f"http://{service}:8000"]


def test_sim_profile_mounts_the_make_demo_config(compose: dict[str, Any]) -> None:
    """The sim gateway's --config is config/tiergate.sim.yaml, the file `make demo` serves."""
    assert _config_source(compose, "gateway-sim") == "./config/tiergate.sim.yaml"
    demo = (REPO / "scripts" / "demo.sh").read_text(encoding="utf-8")
    assert "serve --config config/tiergate.sim.yaml" in demo
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:.*\n\t\./scripts/demo\.sh$", makefile, re.MULTILINE)


def test_sim_profile_is_complete_and_gpu_free(compose: dict[str, Any]) -> None:
    """`--profile sim` starts the gateway, two simulators, Redis and telemetry; no vLLM or GPU."""
    services = services_for(compose, "sim")
    assert set(services) == {
        "gateway-sim",
        "sim-fast",
        "sim-precise",
        "redis",
        "otel-collector",
        "jaeger",
        "prometheus",
        "grafana",
    }
    for name, service in services.items():
        assert "deploy" not in service, f"{name} reserves devices"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on {dependency} outside the profile"


def test_gpu_profile_is_complete(compose: dict[str, Any]) -> None:
    """`--profile gpu` starts the gateway, both vLLM tiers, Redis and telemetry, no simulator."""
    services = services_for(compose, "gpu")
    assert set(services) == {
        "gateway",
        "vllm-fast",
        "vllm-precise",
        "redis",
        "otel-collector",
        "jaeger",
        "prometheus",
        "grafana",
    }
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on {dependency} outside the profile"


def test_sim_gateway_points_at_the_simulators(compose: dict[str, Any]) -> None:
    """The sim gateway's replica URLs reach the simulators' ports, serving the config's models."""
    env = environment_of(compose["services"]["gateway-sim"])
    config = _load_config("config/tiergate.sim.yaml")
    for tier, variable in (("fast", "TIERGATE_FAST_URL"), ("precise", "TIERGATE_PRECISE_URL")):
        url = env[variable]
        assert url is not None
        host, port = url.removeprefix("http://").split(":")
        command = compose["services"][host]["command"]
        assert command[command.index("--port") + 1] == port
        assert command[command.index("--model") + 1] == config["tiers"][tier]["model"]
        assert command[command.index("--host") + 1] == "0.0.0.0"
        assert f"${{{variable}:-" in config["tiers"][tier]["replicas"][0]


@pytest.mark.parametrize(("profile", "gateway"), GATEWAYS.items())
def test_stop_grace_outlasts_the_longest_stream(
    compose: dict[str, Any], profile: str, gateway: str
) -> None:
    """docker stop waits longer than the gateway's drain, which outlasts the longest stream."""
    config = _load_config(_config_source(compose, gateway))
    longest = max(t["timeouts"]["total_s"] for t in config["tiers"].values())
    drain = config["server"]["shutdown_grace_s"]
    grace = duration_seconds(compose["services"][gateway]["stop_grace_period"])
    assert longest <= drain < grace, profile


def _secret_like_values(compose: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    found = []
    for name, service in compose["services"].items():
        for key, value in environment_of(service).items():
            if SECRET_NAME.search(key):
                found.append((name, key, value))
    return found


def test_no_secret_is_written_inline(compose: dict[str, Any]) -> None:
    """Secret-looking variables point at files, pass through from the shell, or are unset."""
    for name, key, value in _secret_like_values(compose):
        passes_through = value is None
        from_file = value is not None and (
            key.endswith("_FILE") or value.startswith("/run/secrets/")
        )
        assert passes_through or from_file, f"{name}: {key} is set inline"
    for secret in compose["secrets"].values():
        assert set(secret) == {"file"}
    text = COMPOSE_PATH.read_text(encoding="utf-8")
    assert "--api-key" not in text
    # Redis's password is read from its secret file when Redis starts, never written here.
    read_at_start = 'requirepass \\"$$(cat /run/secrets/redis_password)\\"'
    assert text.count("requirepass") == text.count(read_at_start) == 1


def test_gateway_secrets_arrive_as_files(compose: dict[str, Any]) -> None:
    """Both gateways get the keys file and admin token as compose secrets."""
    for gateway in GATEWAYS.values():
        service = compose["services"][gateway]
        assert set(service["secrets"]) == {
            "tiergate_keys",
            "tiergate_admin_token",
            "redis_password",
        }
        env = environment_of(service)
        assert env["TIERGATE_KEYS_FILE"] == "/run/secrets/tiergate_keys"
        assert env["TIERGATE_ADMIN_TOKEN_FILE"] == "/run/secrets/tiergate_admin_token"


def test_images_are_pinned_by_tag(compose: dict[str, Any]) -> None:
    """Every image names an explicit tag, never an implicit or explicit `latest`."""
    for name, service in compose["services"].items():
        image = interpolate(service["image"])
        repository, _, tag = image.rpartition(":")
        assert repository, image
        assert tag not in {"", "latest"}, f"{name}: {image}"
        assert "/" not in tag


def test_referenced_files_exist(compose: dict[str, Any]) -> None:
    """Every config and bind-mounted directory compose.yaml names is in the repository."""
    for config in compose["configs"].values():
        assert (REPO / config["file"]).is_file(), config["file"]
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), source
