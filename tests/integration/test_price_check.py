"""A fast tier priced above the precise one (per token, or per replica-hour) is flagged by
``tiergate config check`` and by a warning line at start-up, which still starts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import free_port, patience, run_tiergate


def _config(
    fast_cost: dict[str, float] | None, precise_cost: dict[str, float] | None
) -> dict[str, Any]:
    dead = [f"http://127.0.0.1:{free_port()}"]
    tiers = tiers_config(dead, dead)
    if fast_cost is not None:
        tiers["fast"]["cost"] = fast_cost
    if precise_cost is not None:
        tiers["precise"]["cost"] = precise_cost
    return {"auth": {"enabled": False}, "tiers": tiers, "telemetry": {"log_format": "json"}}


def _check(tmp_path: Path, config: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "tiergate.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    done = run_tiergate("config", "check", str(path))
    return done.returncode, done.stderr


def test_config_check_flags_a_fast_tier_dearer_per_token(tmp_path: Path) -> None:
    """fast at 2 per 1k output tokens against the default precise 1: a warning naming the
    setting and both prices; the file is still valid (exit 0)."""
    code, err = _check(tmp_path, _config({"input_per_1k": 0.1, "output_per_1k": 2.0}, None))
    assert code == 0
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "tiers.fast.cost" in warning
    assert "output" in warning
    assert "2.0 > 1.0" in warning
    assert "savings" in warning


def test_config_check_flags_a_fast_tier_dearer_per_replica_hour(tmp_path: Path) -> None:
    """Both tiers priced by the replica-hour, fast dearer: flagged per replica-hour and per
    token (the same throughput makes each fast token dearer too)."""
    fast = {"replica_hour": 10.0, "tokens_per_s": 100.0}
    precise = {"replica_hour": 4.0, "tokens_per_s": 100.0}
    code, err = _check(tmp_path, _config(fast, precise))
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert any("replica-hour" in line and "10.0 > 4.0" in line for line in warnings), err
    assert all("tiers.fast.cost" in line for line in warnings)


def test_config_check_is_quiet_about_sane_prices(tmp_path: Path) -> None:
    """Defaults, or fast cheaper than precise: no warning."""
    for fast, precise in (
        (None, None),
        ({"input_per_1k": 0.1, "output_per_1k": 0.3}, {"input_per_1k": 0.5, "output_per_1k": 1.5}),
        (
            {"replica_hour": 2.0, "tokens_per_s": 400.0},
            {"replica_hour": 4.0, "tokens_per_s": 100.0},
        ),
    ):
        code, err = _check(tmp_path, _config(fast, precise))
        assert code == 0
        assert "warning:" not in err, err


def test_start_up_warns_about_inverted_prices_and_still_serves() -> None:
    """A gateway with fast dearer than precise starts, answers /livez, and logs one
    config.prices_inverted warning naming the setting."""
    config = _config({"input_per_1k": 3.0, "output_per_1k": 3.0}, None)
    with GatewayProcess(config) as gw:
        assert httpx.get(gw.url + "/livez").status_code == 200
        deadline = time.monotonic() + patience(5)
        while True:
            lines = [json.loads(x) for x in gw.log_text().splitlines() if x[:1] == "{"]
            found = [x for x in lines if x.get("event") == "config.prices_inverted"]
            if found:
                break
            assert time.monotonic() < deadline, gw.log_text()[-3000:]
            time.sleep(0.05)
        assert found[0]["level"] == "warning"
        assert found[0]["setting"] == "tiers.fast.cost"
        assert {x["price"] for x in found} == {"input_per_1k", "output_per_1k"}
