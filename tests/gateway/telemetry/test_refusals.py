"""Refused credentials: the route class and reason each refusal counts under, and the warning
line at most once per interval per route class, carrying what it held back."""

from __future__ import annotations

import structlog
from prometheus_client import CollectorRegistry

from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.refusals import REASONS, ROUTE_CLASSES, AuthRefusals, reason_of, route_class
from policies.errors import AuthenticationFailed, PermissionDenied
from policies.keys import bearer_token


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _refusals() -> tuple[AuthRefusals, GatewayMetrics, _Clock]:
    metrics = GatewayMetrics(CollectorRegistry(), {}, precise_tier="precise", target_share=0.3)
    clock = _Clock()
    return AuthRefusals(metrics.auth_refusals, interval_s=10.0, clock=clock), metrics, clock


def test_route_classes_and_reasons_are_a_fixed_set() -> None:
    """Whatever path or code a caller brings, the labels come from two short fixed lists."""
    assert route_class("/admin/keys/x") == route_class("/admin/usage") == "admin"
    assert route_class("/metrics") == "metrics"
    assert route_class("/v1/models/anything/at/all") == "models"
    assert route_class("/v1/chat/completions") == route_class("/v1/completions/") == "inference"
    assert route_class("/some/" + "x" * 500) == "other"
    for error in (
        AuthenticationFailed("x", code="missing_api_key"),
        AuthenticationFailed("x", code="missing_admin_token"),
        AuthenticationFailed("x"),
        AuthenticationFailed("x", code="invalid_admin_token"),
        AuthenticationFailed("x", code="api_key_revoked"),
        AuthenticationFailed("x", code="api_key_expired"),
        PermissionDenied("x", code="admin_required"),
        PermissionDenied("x"),
        AuthenticationFailed("x", code="made-up-by-someone"),
    ):
        assert reason_of(error.code) in REASONS
    assert reason_of("missing_api_key") == reason_of("missing_admin_token") == "missing"
    assert reason_of("admin_required") == "api_key_on_admin"
    assert reason_of("surprise") == "other"
    assert set(ROUTE_CLASSES) == {"admin", "metrics", "models", "inference", "other"}


def test_one_warning_per_interval_per_route_class_with_the_count_held_back() -> None:
    """The first refusal logs at once; later ones within 10 s are counted, not logged; the next
    line after the interval says how many there were and of which reasons."""
    refusals, metrics, clock = _refusals()
    with structlog.testing.capture_logs() as logs:
        refusals.refused("/admin/keys", "invalid_admin_token", "10.0.0.7")
        for _ in range(5):
            clock.now += 1
            refusals.refused("/admin/keys", "invalid_admin_token", "10.0.0.7")
        refusals.refused("/admin/usage", "missing_admin_token", "10.0.0.8")
        refusals.refused("/metrics", "missing_admin_token", None)  # another class: its own line
        clock.now += 10
        refusals.refused("/admin/keys", "admin_required", "10.0.0.9")
    lines = [line for line in logs if line["event"] == "auth.refused"]
    assert [(x["route"], x["count"]) for x in lines] == [("admin", 1), ("metrics", 1), ("admin", 7)]
    assert lines[0]["log_level"] == "warning"
    assert lines[0]["client"] == "10.0.0.7"
    assert lines[2]["reasons"] == {"invalid": 5, "missing": 1, "api_key_on_admin": 1}
    assert lines[2]["reason"] == "api_key_on_admin"
    assert lines[2]["client"] == "10.0.0.9"
    counted = metrics.auth_refusals.values
    assert counted == {
        ("admin", "invalid"): 6.0,
        ("admin", "missing"): 1.0,
        ("admin", "api_key_on_admin"): 1.0,
        ("metrics", "missing"): 1.0,
    }


def test_a_caller_chosen_code_cannot_grow_the_label_set() -> None:
    """Thousands of odd codes and paths stay within route classes x reasons series."""
    refusals, metrics, _ = _refusals()
    with structlog.testing.capture_logs():
        for i in range(2000):
            refusals.refused(f"/x{i}", f"code{i}", None)
    assert set(metrics.auth_refusals.values) == {("other", "other")}


def test_the_refused_header_never_reaches_the_line() -> None:
    """Only the route class, reason, count and client are logged (no header, no token part)."""
    refusals, _, _ = _refusals()
    try:
        bearer_token("Bearer", admin=True)
    except AuthenticationFailed as exc:
        code = exc.code
    with structlog.testing.capture_logs() as logs:
        refusals.refused("/admin/keys", code, "127.0.0.1")
    (line,) = logs
    assert set(line) == {"event", "log_level", "route", "reason", "count", "reasons", "client",
                         "interval_s"}  # fmt: skip
