"""Start-up failures of real `tiergate` processes: one line, what and where, exit code 2."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.processes import run_tiergate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _one_line_failure(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tiergate: ")
    for needle in needles:
        assert needle in lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    """A --config that does not exist: its path and 'not found', no traceback."""
    missing = tmp_path / "nope.yaml"
    _one_line_failure(run_tiergate("serve", "--config", str(missing)), str(missing), "not found")


def test_a_bad_config_fails_before_the_app_is_imported(tmp_path: Path) -> None:
    """`serve` on a config it refuses exits before importing the web framework, Redis or the
    router (seconds of a fresh interpreter's time): the settings are checked first."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"ratelimit": {"backnd": "redis"}}))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gateway", "serve", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "tiergate: ratelimit.backnd" in done.stderr
    # `import time: self | cumulative | <indent>name`, one line per module imported
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "gateway.config.settings" in imported  # the listing is read right
    heavy = {"litestar", "redis", "numpy", "uvicorn", "httpx", "structlog", "router_models"}
    assert heavy & imported == set()


def test_config_is_a_directory(tmp_path: Path) -> None:
    """A directory given as --config is named as such."""
    _one_line_failure(run_tiergate("serve", "--config", str(tmp_path)), "is a directory")


def test_config_not_utf8(tmp_path: Path) -> None:
    """A binary file as --config is reported as not text."""
    config = tmp_path / "c.yaml"
    config.write_bytes(b"\xff\xfe\x00bad")
    _one_line_failure(run_tiergate("serve", "--config", str(config)), "not UTF-8")


def test_bad_yaml_names_line_and_column(tmp_path: Path) -> None:
    """Broken YAML says which line and column."""
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  port: 8080\n   host: x\n")
    _one_line_failure(
        run_tiergate("serve", "--config", str(config)), "line 3, column", "invalid YAML"
    )


def test_duplicate_key_refused(tmp_path: Path) -> None:
    """A section given twice (the later would silently win) is refused with its line."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "ratelimit: {backend: redis}\nserver: {port: 1}\nratelimit: {backend: memory}\n"
    )
    _one_line_failure(
        run_tiergate("serve", "--config", str(config)),
        "line 3, column 1",
        "duplicate key 'ratelimit'",
    )


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    """A YAML list at the top level is refused."""
    config = tmp_path / "c.yaml"
    config.write_text("- server\n")
    _one_line_failure(run_tiergate("serve", "--config", str(config)), "must be a mapping")


def test_bad_value_in_file(tmp_path: Path) -> None:
    """A value out of range: the dotted path, the file and the reason."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"server": {"port": 70000}}))
    _one_line_failure(run_tiergate("serve", "--config", str(config)), "server.port", str(config))


def test_nested_typo_in_file(tmp_path: Path) -> None:
    """A typo inside a section stops the gateway with a suggestion."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"ratelimit": {"backnd": "redis"}}))
    _one_line_failure(
        run_tiergate("serve", "--config", str(config)),
        "ratelimit.backnd",
        "did you mean `backend`?",
    )


def test_environment_typo() -> None:
    """A misspelled TIERGATE_* variable stops the gateway with the corrected name."""
    result = run_tiergate("serve", env={"TIERGATE_TELEMETRY__TRACNG": "true"})
    _one_line_failure(result, "TIERGATE_TELEMETRY__TRACNG", "TIERGATE_TELEMETRY__TRACING")


def test_port_in_use(tmp_path: Path) -> None:
    """A port someone else listens on: the address and 'already in use'."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"auth": {"enabled": False}, "exposure": {"mode": "off"}}))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_tiergate("serve", "--config", str(config), "--port", str(port))
    _one_line_failure(result, f"127.0.0.1:{port}", "already in use")


def test_debug_shows_traceback(tmp_path: Path) -> None:
    """--debug turns the one-line message back into a traceback for the developer."""
    result = run_tiergate("--debug", "serve", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode != 0
    assert "Traceback" in result.stderr


def test_missing_admin_token_file(tmp_path: Path) -> None:
    """A settings file path that does not exist (admin token file) is one line, not a trace."""
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "auth": {"enabled": False, "admin_token_file": str(tmp_path / "absent")},
                "exposure": {"mode": "off"},
            }
        )
    )
    _one_line_failure(run_tiergate("serve", "--config", str(config), "--port", "0"), "absent")


def test_check_exposure_error_exits_nonzero(tmp_path: Path) -> None:
    """check-exposure exits 1 whenever it prints an error finding, even in warn mode."""
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tiers": {
                    "fast": {"model": "f", "replicas": ["http://8.8.8.8:8000"]},
                    "precise": {"model": "p", "replicas": ["http://127.0.0.1:8102"]},
                },
                "exposure": {"mode": "warn"},
            }
        )
    )
    result = run_tiergate("check-exposure", "--config", str(config))
    assert "error:" in result.stdout
    assert result.returncode == 1


def test_config_check_shows_sources_and_masks_secrets(tmp_path: Path) -> None:
    """config check lists each value with default/file/env/flag and hides secrets."""
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump({"server": {"port": 9000}, "auth": {"admin_token": "s3cret-admin-token"}})
    )
    result = run_tiergate(
        "config",
        "check",
        str(config),
        env={"TIERGATE_REDIS__URL": "redis://user:hunter2@10.0.0.5:6379/0"},
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split(":")[0]: line for line in result.stdout.splitlines()}
    assert lines["server.port"].endswith(f"(file {config})")
    assert lines["server.host"].endswith("(default)")
    assert lines["redis.url"].endswith("(env TIERGATE_REDIS__URL)")
    assert "redis://user:***@10.0.0.5:6379/0" in lines["redis.url"]
    assert '"***"' in lines["auth.admin_token"]
    assert "s3cret" not in result.stdout + result.stderr
    assert "hunter2" not in result.stdout + result.stderr


def test_config_check_refuses_typo(tmp_path: Path) -> None:
    """config check fails like serve on a typo."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"telemetry": {"tracng": True}}))
    _one_line_failure(run_tiergate("config", "check", str(config)), "did you mean `tracing`?")


def test_config_schema_is_json_schema_refusing_typos() -> None:
    """config schema prints a JSON Schema that forbids unknown keys in sections."""
    result = run_tiergate("config", "schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["RateLimitSettings"]["additionalProperties"] is False


def _with_missing_secret_file(setting: str, absent: str) -> dict[str, object]:
    """Gateway settings whose ``setting`` (a secret file) names ``absent``."""
    tiers = {
        "fast": {"model": "f", "replicas": ["http://127.0.0.1:8101"]},
        "precise": {"model": "p", "replicas": ["http://127.0.0.1:8102"]},
    }
    auth: dict[str, object] = {"enabled": False}
    if setting == "auth.admin_token_file":
        auth["admin_token_file"] = absent
    else:
        tiers["fast"]["api_key_file"] = absent
    return {"auth": auth, "tiers": tiers, "exposure": {"mode": "off"}}


@pytest.mark.parametrize("setting", ["auth.admin_token_file", "tiers.fast.api_key_file"])
def test_a_missing_secret_file_names_its_setting(tmp_path: Path, setting: str) -> None:
    """A secret file that is not there names the setting that points at it (it used to be a
    bare `[Errno 2] No such file or directory: '...'`, which left the operator to guess)."""
    absent = str(tmp_path / "absent")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_with_missing_secret_file(setting, absent)))
    result = run_tiergate("serve", "--config", str(config), "--port", "0")
    _one_line_failure(result, setting, absent, "not found")
