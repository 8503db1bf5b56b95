"""At start the gateway raises its open-file limit to the hard limit, and warns when it is low."""

from __future__ import annotations

import json
import subprocess
import sys

# Run in a child process: the limits are the process's own, and the child sets them first.
_CHILD = """
import json, resource, sys
from structlog.testing import capture_logs
from gateway.http.connections import raise_fd_limit
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
with capture_logs() as logs:
    fds = raise_fd_limit()
print(json.dumps({"fds": fds, "now": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                  "events": [(e["event"], e.get("fd_limit"), e.get("connection_cap"))
                             for e in logs]}))
"""


def raised(soft: int, hard: int) -> dict[str, object]:
    """What ``raise_fd_limit`` returned, the soft limit after, and the events it logged."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(soft), str(hard)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_a_low_soft_limit_is_raised_to_the_hard_limit() -> None:
    """Soft 1,024 under hard 8,192 becomes 8,192, logged once, with no warning."""
    result = raised(1024, 8192)
    assert result["fds"] == result["now"] == 8192
    assert result["events"] == [["server.fd_limit_raised", None, None]]


def test_a_low_hard_limit_is_raised_to_and_warned_about_with_the_cap() -> None:
    """Hard 1,024: the soft limit rises to it, and start-up warns with the connection cap."""
    result = raised(512, 1024)
    assert result["fds"] == 1024
    assert result["events"] == [
        ["server.fd_limit_raised", None, None],
        ["server.fd_limit_low", 1024, (1024 - 256) // 2],
    ]
