"""Drive `wrk` with a POST of a small chat completion and parse what it reports.

The Lua script's ``done`` hook prints one machine-readable line (``WRK_JSON {...}``) with the
request count, duration, error counts and latency percentiles in microseconds, so parsing does
not depend on wrk's human-readable units. With ``stop_after`` the script stops the (single)
thread once that many responses arrived, which turns a duration run into a request-count run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.harness.processes import boost_session

JSON_MARK = "WRK_JSON "
STATUS_MARK = "WRK_STATUS "  # a script that counts answers by status prints them after this

_LUA_TEMPLATE = """\
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
{auth}
local stop_after = {stop_after}
local seen = 0
{response_hook}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{mark}{{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, '
    .. '"status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, '
    .. '"mean_us": %.1f}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
"""

_RESPONSE_HOOK = """\
function response(status, headers, body)
  seen = seen + 1
  if seen >= stop_after then
    wrk.thread:stop()
  end
end
"""


@dataclass(frozen=True)
class WrkResult:
    """One wrk run: throughput, latency percentiles and error counts."""

    requests: int
    duration_s: float
    errors: int
    non_2xx: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float

    @property
    def rps(self) -> float:
        """Completed requests per second over the run."""
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0


def lua_script(
    body: dict[str, object],
    api_key: str | None,
    stop_after: int = 0,
    headers: dict[str, str] | None = None,
) -> str:
    """Render the wrk Lua script for one POST body (optional bearer key and extra headers)."""
    lines = [f'wrk.headers["Authorization"] = "Bearer {api_key}"'] if api_key else []
    lines += [
        f"wrk.headers[{lua_string(name)}] = {lua_string(value)}"
        for name, value in (headers or {}).items()
    ]
    auth = "\n".join(lines)
    return _LUA_TEMPLATE.format(
        body=lua_string(json.dumps(body, separators=(",", ":"))),
        auth=auth,
        stop_after=stop_after,
        response_hook=_RESPONSE_HOOK if stop_after > 0 else "",
        mark=JSON_MARK,
    )


def lua_string(text: str) -> str:
    """``text`` as a double-quoted Lua string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_output(stdout: str) -> WrkResult:
    """Extract the WRK_JSON line written by the script's ``done`` hook."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(JSON_MARK):
            raw = json.loads(line[len(JSON_MARK) :])
            errors = sum(int(raw[k]) for k in ("connect", "read", "write", "timeout"))
            return WrkResult(
                requests=int(raw["requests"]),
                duration_s=int(raw["duration_us"]) / 1e6,
                errors=errors,
                non_2xx=int(raw["status"]),
                p50_ms=int(raw["p50_us"]) / 1000,
                p90_ms=int(raw["p90_us"]) / 1000,
                p99_ms=int(raw["p99_us"]) / 1000,
                mean_ms=float(raw["mean_us"]) / 1000,
            )
    raise ValueError(f"no {JSON_MARK.strip()} line in wrk output:\n{stdout[-2000:]}")


def parse_statuses(stdout: str) -> dict[int, int]:
    """Answers by HTTP status from the STATUS_MARK line (empty when the script has none)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(STATUS_MARK):
            raw = json.loads(line[len(STATUS_MARK) :])
            return {int(status): int(count) for status, count in raw.items()}
    return {}


def ensure_wrk() -> str:
    """Return the wrk binary, installing Debian's package when running as root."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        raise SystemExit(
            "wrk is not installed. Install it (Debian/Ubuntu: `sudo apt-get install -y wrk`) "
            "and run again."
        )
    print("installing wrk with apt-get ...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("apt-get install wrk succeeded but `wrk` is not on PATH")
    return found


@dataclass(frozen=True)
class WrkRunner:
    """Runs wrk with one thread, pinned to the load generator's CPUs."""

    binary: str
    script_dir: Path
    pin: tuple[str, ...]
    boost: bool = False

    def run(
        self,
        url: str,
        script: str,
        connections: int,
        duration_s: float,
        timeout_s: float = 10.0,
    ) -> WrkResult:
        """Run one point and return its parsed result."""
        return parse_output(self.run_raw(url, script, connections, duration_s, timeout_s))

    def run_raw(
        self,
        url: str,
        script: str,
        connections: int,
        duration_s: float,
        timeout_s: float = 10.0,
    ) -> str:
        """Run one point and return wrk's standard output."""
        path = self.script_dir / f"wrk-{abs(hash(script))}.lua"
        path.write_text(script)
        cmd = [
            *self.pin,
            self.binary,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(duration_s))}s",
            f"--timeout={max(1, round(timeout_s))}s",
            "--latency",
            "-s",
            str(path),
            url,
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        if self.boost:
            boost_session(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=duration_s + timeout_s + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"wrk failed ({proc.returncode}): {stderr.strip()}")
        return stdout
