"""README "Logging": ``server.workers_defaulted`` goes through the configured logging.

It used to be printed console-formatted on stdout before logging was configured, whatever
``telemetry.log_format`` said, and never reached ``telemetry.log_file``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gateway.access.keystore_file import FileKeyStore
from gateway.http.workers import usable_cores
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import REPO_ROOT, tiers_config
from tests.processes import free_port, http_answers, terminate, wait_ready

pytestmark = pytest.mark.slow


@pytest.mark.skipif(usable_cores() < 2, reason="the default is lowered only with 2+ cores")
def test_workers_defaulted_is_a_json_line_in_the_log_file(tmp_path: Path) -> None:
    """With log_format json and a log_file, the line is JSON in the file, not text on stdout."""
    keys = tmp_path / "keys.yaml"
    record, _ = issue_key("k", KeyPolicy(), now=time.time())
    FileKeyStore(keys).put_sync(record)
    log_file = tmp_path / "gateway.jsonl"
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "auth": {"keys_file": str(keys)},
                "telemetry": {"log_format": "json", "log_file": str(log_file)},
                "tiers": tiers_config(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]),
            }
        ),
        encoding="utf-8",
    )
    port = free_port()
    out = tmp_path / "out.txt"
    command = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [*command, "--port", str(port)], cwd=REPO_ROOT, stdout=sink, stderr=sink
        )
    try:
        wait_ready(
            proc,
            lambda: http_answers(f"http://127.0.0.1:{port}/livez"),
            timeout=30,
            poll_s=0.1,
            what="gateway",
            log=lambda: out.read_text(errors="replace"),
        )
    finally:
        terminate(proc)
    assert "workers_defaulted" not in out.read_text(errors="replace")
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    defaulted = [line for line in lines if line["event"] == "server.workers_defaulted"]
    assert len(defaulted) == 1
    assert defaulted[0]["workers"] == 1
    assert defaulted[0]["level"] == "info"
