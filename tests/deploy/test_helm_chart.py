"""The Helm chart lints, renders valid Kubernetes objects, and locks the model servers down."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy import chart_render
from tests.deploy.chart_render import CHART, matches, of_kind, pod_templates

BIN = Path(sys.executable).parent
KUBE_VERSION = "1.30.0"  # the oldest bundled schema the chart's kubeVersion admits
CRD_KINDS = {"ServiceMonitor"}  # custom resources: kubernetes-validate has no schema for them
GATEWAY = {"app.kubernetes.io/component": "gateway", "app.kubernetes.io/instance": "tg"}
SENTINELS = ("SENTINEL-KEYS-FILE-CONTENT", "SENTINEL-ADMIN-TOKEN-VALUE")


def _labels(template: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = template["metadata"]["labels"]
    return labels


def _component(labels: dict[str, str]) -> str:
    return labels["app.kubernetes.io/component"]


def _gateway_config(items: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [c for c in of_kind(items, "ConfigMap") if "tiergate.yaml" in c["data"]]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["tiergate.yaml"])
    return config


def _policies_for(items: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [p for p in of_kind(items, "NetworkPolicy") if matches(p["spec"]["podSelector"], labels)]


def _vllm_pods(items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, template)
        for name, template in pod_templates(items)
        if _component(_labels(template)) == "vllm"
    ]


def _gateway_deployment(items: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [
        d for d in of_kind(items, "Deployment") if _component(d["metadata"]["labels"]) == "gateway"
    ]
    return deployment


@pytest.mark.parametrize("values_path", [None, chart_render.EVERYTHING_ON])
def test_chart_lints_clean_in_strict_mode(values_path: Path | None) -> None:
    """`helm lint --strict` (through the Helm SDK) reports no warning or error."""
    values = chart_render.values_file(values_path) if values_path else None
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_rendered_manifest_passes_kubernetes_validate_strict(
    tmp_path: Path, default_render: dict[str, str], everything_render: dict[str, str]
) -> None:
    """kubernetes-validate --strict accepts every rendered object of both renders."""
    files = []
    for label, rendered in (("default", default_render), ("everything", everything_render)):
        for template, text in rendered.items():
            docs = [d for d in yaml.safe_load_all(text) if d] if template.endswith(".yaml") else []
            if docs:
                target = tmp_path / label / Path(template).name
                target.parent.mkdir(exist_ok=True)
                target.write_text(text, encoding="utf-8")
                files.append(str(target))
    result = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", KUBE_VERSION, *files],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    warnings = [line for line in lines if line.startswith("WARN")]
    assert all(any(kind in line for kind in CRD_KINDS) for line in warnings), warnings
    passed = [line for line in lines if line.startswith("INFO") and "passed" in line]
    expected = sum(
        1
        for rendered in (default_render, everything_render)
        for obj in chart_render.objects(rendered)
        if obj["kind"] not in CRD_KINDS
    )
    assert len(passed) == expected


def test_strict_validation_rejects_unknown_fields(tmp_path: Path) -> None:
    """The validator is strict: a Deployment with a misspelt field fails."""
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n"
        "  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n"
        "    spec:\n      containers: [{name: c, image: i, securityContex: {}}]\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", KUBE_VERSION, str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "securityContex" in result.stdout


def test_service_monitor_targets_the_metrics_port(everything_objects: list[dict[str, Any]]) -> None:
    """The ServiceMonitor (a CRD, checked by hand) scrapes the gateway Service's metrics port."""
    (monitor,) = of_kind(everything_objects, "ServiceMonitor")
    (service,) = [
        s
        for s in of_kind(everything_objects, "Service")
        if matches(monitor["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_every_service_is_cluster_ip(any_objects: list[dict[str, Any]]) -> None:
    """No Service, vLLM's least of all, is a NodePort or LoadBalancer."""
    services = of_kind(any_objects, "Service")
    assert services
    for service in services:
        assert service["spec"]["type"] == "ClusterIP", service["metadata"]["name"]


def test_vllm_services_are_cluster_ip_one_per_replica(
    everything_objects: list[dict[str, Any]],
) -> None:
    """Each in-chart vLLM replica has its own ClusterIP Service, selecting exactly that pod."""
    pods = _vllm_pods(everything_objects)
    assert len(pods) == 3
    vllm_services = [
        s
        for s in of_kind(everything_objects, "Service")
        if _component(s["metadata"]["labels"]) == "vllm"
    ]
    assert len(vllm_services) == len(pods)
    for service in vllm_services:
        assert service["spec"]["type"] == "ClusterIP"
        selected = [
            n for n, t in pods if matches({"matchLabels": service["spec"]["selector"]}, _labels(t))
        ]
        assert selected == [service["metadata"]["name"]]


def test_a_network_policy_admits_only_gateway_pods_to_every_vllm_pod(
    everything_objects: list[dict[str, Any]],
) -> None:
    """Every vLLM pod is selected by ingress policies whose only peers are gateway pods."""
    gateway_labels = _labels(_gateway_deployment(everything_objects)["spec"]["template"])
    for name, template in _vllm_pods(everything_objects):
        policies = [
            p
            for p in _policies_for(everything_objects, _labels(template))
            if "Ingress" in p["spec"]["policyTypes"]
        ]
        assert policies, f"no policy selects {name}"
        rules = [rule for p in policies for rule in p["spec"].get("ingress", [])]
        assert rules, f"{name} admits nothing at all"
        for rule in rules:
            assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, f"{name} admits {peer}"
                assert matches(peer["podSelector"], gateway_labels)
                assert _component(peer["podSelector"]["matchLabels"]) == "gateway"


def test_redis_admits_only_the_gateway(any_objects: list[dict[str, Any]]) -> None:
    """Redis accepts connections only from gateway pods, on 6379, and reaches nothing."""
    ((_, template),) = [
        (n, t) for n, t in pod_templates(any_objects) if _component(_labels(t)) == "redis"
    ]
    policies = _policies_for(any_objects, _labels(template))
    rules = [rule for p in policies for rule in p["spec"].get("ingress", [])]
    assert rules
    for rule in rules:
        assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
        assert [peer["podSelector"]["matchLabels"] for peer in rule["from"]] == [
            {"app.kubernetes.io/name": "tiergate", **GATEWAY}
        ]
    assert all(not p["spec"].get("egress") for p in policies)


def test_metrics_port_admits_only_a_named_namespace(any_objects: list[dict[str, Any]]) -> None:
    """The unauthenticated metrics port is open to one named namespace, never to all of them."""
    gateway_labels = _labels(_gateway_deployment(any_objects)["spec"]["template"])
    rules = [
        rule
        for p in _policies_for(any_objects, gateway_labels)
        for rule in p["spec"].get("ingress", [])
        if {"port": "metrics", "protocol": "TCP"} in rule["ports"]
    ]
    assert len(rules) == 1
    assert rules[0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rules[0]["from"], "a rule without peers admits every source"
    for peer in rules[0]["from"]:
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "monitoring"
        }


def test_docs_say_the_lockdown_needs_a_cni_that_enforces_network_policy() -> None:
    """The chart README and the main README warn that NetworkPolicy needs an enforcing CNI."""
    for readme in (CHART / "README.md", CHART.parents[1] / "README.md"):
        text = " ".join(readme.read_text(encoding="utf-8").split())
        assert "CNI" in text, readme
        assert "enforces NetworkPolicy" in text, readme


def test_default_deny_covers_every_pod_of_the_release(any_objects: list[dict[str, Any]]) -> None:
    """A rule-less Ingress+Egress policy selects every pod the chart creates."""
    deny = [
        p
        for p in of_kind(any_objects, "NetworkPolicy")
        if set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
        and p["metadata"]["name"].endswith("default-deny")
    ]
    assert len(deny) == 1
    for name, template in pod_templates(any_objects):
        assert matches(deny[0]["spec"]["podSelector"], _labels(template)), name


def test_gateway_egress_goes_only_to_vllm_redis_dns_and_otlp(
    everything_objects: list[dict[str, Any]],
) -> None:
    """The gateway may reach in-chart vLLM and Redis pods, DNS on 53 and the collector, no more."""
    gateway_labels = _labels(_gateway_deployment(everything_objects)["spec"]["template"])
    policies = _policies_for(everything_objects, gateway_labels)
    egress = [rule for p in policies for rule in p["spec"].get("egress", [])]
    ports = sorted({port["port"] for rule in egress for port in rule["ports"]})
    assert ports == [53, 4318, 6379, 8000]
    for rule in egress:
        assert rule["to"], "an egress rule without peers allows everywhere"
        for peer in rule["to"]:
            assert "ipBlock" not in peer
        in_chart = {8000: "vllm", 6379: "redis"}
        (port, *_) = [p["port"] for p in rule["ports"]]
        if port in in_chart:
            components = [_component(peer["podSelector"]["matchLabels"]) for peer in rule["to"]]
            assert components == [in_chart[port]]


def test_gateway_pod_is_non_root_read_only_and_tokenless(any_objects: list[dict[str, Any]]) -> None:
    """The gateway runs as non-root on a read-only root filesystem with no capabilities."""
    spec = _gateway_deployment(any_objects)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert {"livenessProbe", "readinessProbe"} <= set(container)
    assert container["resources"]["requests"]
    (account,) = of_kind(any_objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False


def test_gateway_pod_gets_no_service_link_variables(any_objects: list[dict[str, Any]]) -> None:
    """The gateway pod turns service links off: Kubernetes would otherwise put a
    ``TIERGATE_PORT=tcp://...`` variable per Service (release named ``tiergate``) into the
    environment the settings read under the ``TIERGATE_`` prefix."""
    spec = _gateway_deployment(any_objects)["spec"]["template"]["spec"]
    assert spec["enableServiceLinks"] is False


def test_termination_grace_outlasts_the_longest_stream(any_objects: list[dict[str, Any]]) -> None:
    """Pods get longer to stop than the gateway drains, and it drains longer than any stream."""
    deployment = _gateway_deployment(any_objects)
    spec = deployment["spec"]["template"]["spec"]
    config = _gateway_config(any_objects)
    longest = max(t["timeouts"]["total_s"] for t in config["tiers"].values())
    pre_stop = int(spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert longest <= config["server"]["shutdown_grace_s"]
    assert spec["terminationGracePeriodSeconds"] > config["server"]["shutdown_grace_s"] + pre_stop


def test_render_refuses_a_grace_period_shorter_than_a_stream() -> None:
    """A termination grace period that would cut streams fails the render."""
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        chart_render.render({"gateway": {"terminationGracePeriodSeconds": 120}})


def test_no_secret_value_appears_in_a_config_map(
    everything_objects: list[dict[str, Any]], everything_render: dict[str, str]
) -> None:
    """Keys and the admin token are only in the Secret, never in a ConfigMap."""
    for config_map in of_kind(everything_objects, "ConfigMap"):
        text = json.dumps(config_map)
        for sentinel in SENTINELS:
            assert sentinel not in text, config_map["metadata"]["name"]
    (secret,) = [
        s
        for s in of_kind(everything_objects, "Secret")
        if s["metadata"]["name"].endswith("-secrets")
    ]
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded["admin-token"] == "SENTINEL-ADMIN-TOKEN-VALUE"
    assert "SENTINEL-KEYS-FILE-CONTENT" in decoded["keys.yaml"]
    assert "SENTINEL" not in everything_render["tiergate/templates/NOTES.txt"]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"config": {"auth": {"admin_token": "x"}}}, "admin_token"),
        ({"config": {"redis": {"url": "redis://:pw@r:6379/0"}}}, "redis/url"),
        ({"service": {"type": "LoadBalancer"}}, "service/type"),
        ({"vllm": {"tiers": {"fast": {"enabled": True, "model": "m", "dtype": "fp8x"}}}}, "dtype"),
        ({"replicaCount": 2, "replicaCountt": 3}, "replicaCountt"),
    ],
)
def test_values_schema_rejects_unsafe_or_mistyped_values(
    values: dict[str, Any], complaint: str
) -> None:
    """values.schema.json refuses secrets in the config, public Services and typos."""
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match=complaint):
        chart.validate_schema(values)


def test_vllm_deployments_run_the_tier_models_with_prefix_caching(
    everything_objects: list[dict[str, Any]],
) -> None:
    """Each vLLM pod serves its tier's model with prefix caching and cached-token counts."""
    config = _gateway_config(everything_objects)
    for _, template in _vllm_pods(everything_objects):
        tier = _labels(template)["tiergate.io/tier"]
        (container,) = template["spec"]["containers"]
        args = container["args"]
        assert "--enable-prefix-caching" in args
        assert "--enable-prompt-tokens-details" in args
        assert args[args.index("--served-model-name") + 1] == config["tiers"][tier]["model"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert template["spec"]["automountServiceAccountToken"] is False
        if tier == "fast":
            assert args[args.index("--quantization") + 1] == "awq_marlin"
        else:
            assert args[args.index("--dtype") + 1] == "float16"


def test_config_points_tiers_at_the_in_chart_replicas(
    everything_objects: list[dict[str, Any]],
) -> None:
    """With in-chart vLLM, each tier lists one cluster-internal URL per replica Service."""
    config = _gateway_config(everything_objects)
    services = {s["metadata"]["name"] for s in of_kind(everything_objects, "Service")}
    assert len(config["tiers"]["fast"]["replicas"]) == 2
    for tier in config["tiers"].values():
        for url in tier["replicas"]:
            host = url.removeprefix("http://").split(".")[0]
            assert host in services
            assert url.endswith(".llm.svc:8000")


def test_everything_on_renders_every_optional_object(
    everything_objects: list[dict[str, Any]],
) -> None:
    """The everything-on values produce the Ingress, HPA, PDB, ServiceMonitor and dashboard."""
    kinds = {obj["kind"] for obj in everything_objects}
    assert {"Ingress", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"} <= kinds
    assert "replicas" not in _gateway_deployment(everything_objects)["spec"]
    dashboards = [
        c for c in of_kind(everything_objects, "ConfigMap") if "tiergate.json" in c["data"]
    ]
    (dashboard,) = dashboards
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    source = chart_render.REPO / "deploy" / "grafana" / "dashboards" / "tiergate.json"
    assert json.loads(dashboard["data"]["tiergate.json"]) == json.loads(
        source.read_text(encoding="utf-8")
    )


def test_defaults_leave_optional_parts_off(default_objects: list[dict[str, Any]]) -> None:
    """Default values render no vLLM, Ingress, HPA, ServiceMonitor or dashboard."""
    kinds = {obj["kind"] for obj in default_objects}
    assert not {"Ingress", "HorizontalPodAutoscaler", "ServiceMonitor"} & kinds
    assert _vllm_pods(default_objects) == []
    assert _gateway_deployment(default_objects)["spec"]["replicas"] == 2


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in container.get("env") or []}


def test_vllm_api_key_reaches_vllm_and_the_gateway_from_a_secret(
    everything_objects: list[dict[str, Any]],
    default_objects: list[dict[str, Any]],
) -> None:
    """With vllm.apiKeySecret, vLLM requires the key and the gateway sends it, per tier."""
    ref = {"secretKeyRef": {"name": "vllm-api-key", "key": "VLLM_API_KEY"}}
    tiers = set()
    for _, template in _vllm_pods(everything_objects):
        (container,) = template["spec"]["containers"]
        assert _env(container)["VLLM_API_KEY"]["valueFrom"] == ref
        tiers.add(_labels(template)["tiergate.io/tier"])
    (gateway,) = _gateway_deployment(everything_objects)["spec"]["template"]["spec"]["containers"]
    env = _env(gateway)
    for tier in tiers:
        assert env[f"TIERGATE_TIERS__{tier.upper()}__API_KEY"]["valueFrom"] == ref
    assert not [
        name
        for name in env
        if name.endswith("__API_KEY") and name.split("__")[1].lower() not in tiers
    ]
    for _, template in pod_templates(default_objects):
        for container in template["spec"]["containers"]:
            assert not [n for n in _env(container) if "API_KEY" in n]
