"""The command line: check-exposure and serve's start-up refusal in strict mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def tiergate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gateway ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_top_level_help_names_every_command() -> None:
    """`tiergate --help` describes every sub-command it offers, simulate and bench included."""
    result = tiergate("--help")
    assert result.returncode == 0
    description = result.stdout.split("positional arguments")[0]
    for command in ("serve", "check-exposure", "config", "keys", "router", "simulate", "bench"):
        assert f"``{command}``" in description


def test_check_exposure_ok_for_defaults() -> None:
    """Loopback backends and a loopback bind pass the check."""
    result = tiergate("check-exposure")
    assert result.returncode == 0
    assert result.stdout.startswith("ok:")


def test_check_exposure_strict_fails_public_backend(tmp_path: Path) -> None:
    """A backend on a public address is an error, and strict mode exits 1."""
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tiers": {
                    "fast": {"model": "f", "replicas": ["http://8.8.8.8:8000"]},
                    "precise": {"model": "p", "replicas": ["http://127.0.0.1:8102"]},
                }
            }
        )
    )
    result = tiergate("check-exposure", "--config", str(config), "--strict")
    assert result.returncode == 1
    assert "8.8.8.8" in result.stdout


@pytest.mark.parametrize("host", ["0x08080808", "134744072"])
def test_check_exposure_classifies_a_dotless_numeric_host_by_its_address(
    tmp_path: Path, host: str
) -> None:
    """A replica written as a dotless number for 8.8.8.8 is upstream_public, not a private name."""
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tiers": {
                    "fast": {"model": "f", "replicas": [f"http://{host}:8000"]},
                    "precise": {"model": "p", "replicas": ["http://127.0.0.1:8102"]},
                }
            }
        )
    )
    result = tiergate("check-exposure", "--config", str(config), "--strict")
    assert result.returncode == 1, result.stdout
    assert "upstream_public" in result.stdout
    assert host in result.stdout


def test_the_readme_tier_environment_example_works_without_tiers_in_the_file(
    tmp_path: Path,
) -> None:
    """README "Configuration": TIERGATE_TIERS__FAST__REPLICAS layers over the embedded tier."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    example = "TIERGATE_TIERS__FAST__REPLICAS='[\"http://10.0.0.5:8000\"]'"
    assert f"`{example}`" in readme
    name, _, quoted = example.partition("=")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"auth": {"enabled": False}}))
    env = {**os.environ, name: quoted.strip("'")}
    result = tiergate("config", "check", str(config), env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(
        line.startswith('tiers.fast.replicas: ["http://10.0.0.5:8000"]') and name in line
        for line in lines
    )
    assert any(line.startswith('tiers.fast.model: "tiergate-fast"') for line in lines)
    assert any(line.startswith('tiers.precise.model: "tiergate-precise"') for line in lines)


def test_serve_refuses_public_bind_in_strict_mode(tmp_path: Path) -> None:
    """`serve` will not start bound to all interfaces without TLS when exposure is strict."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"exposure": {"mode": "strict"}, "auth": {"enabled": False}}))
    result = tiergate("serve", "--config", str(config), "--host", "0.0.0.0", "--port", "1")
    assert result.returncode == 2
    assert "refusing to start" in result.stderr


def test_router_help_lists_the_dial() -> None:
    """`tiergate router --help` names every router sub-command, `dial` (the live share dial
    the README and docs/router.md teach) included, and `dial --help` names its default URL."""
    result = tiergate("router", "--help")
    assert result.returncode == 0, result.stderr
    assert "dial" in result.stdout.split("options:")[0]
    dial = tiergate("router", "dial", "--help")
    assert dial.returncode == 0, dial.stderr
    assert "http://127.0.0.1:8080" in dial.stdout


def test_output_into_a_closed_pipe_is_not_reported_as_an_error(tmp_path: Path) -> None:
    """`tiergate config check FILE | head -1`: the reader leaving early is not a failure the
    command reports (it used to print `tiergate: [Errno 32] Broken pipe`)."""
    config = tmp_path / "c.yaml"
    config.write_text("server: {port: 8080}\n")
    proc = subprocess.Popen(  # this interpreter, fixed arguments
        [sys.executable, "-m", "gateway", "config", "check", str(config)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()  # like `head` exiting before the command writes its first line
    stderr = proc.stderr.read()
    proc.wait(timeout=60)
    assert "Broken pipe" not in stderr
    assert "Traceback" not in stderr
    assert "Exception ignored" not in stderr
