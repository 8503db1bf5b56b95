"""What a TierGate leg's supervisor did during a run, read from the gateway's own log.

With ``--workers N`` the supervisor restarts a worker that died (``server.worker_exited``) and
kills one whose heartbeat stopped (``server.worker_stalled``, after ``server.worker_stall_s``);
either cuts every stream on that worker. A run's stream errors alone do not say which, so the
report counts these lines in the leg's log (``<workdir>/<leg>/tiergate.log``, kept with
``--keep-workdir``) and quotes the first of each.
"""

from __future__ import annotations

from pathlib import Path

SUPERVISION_EVENTS = ("server.worker_stalled", "server.worker_exited", "server.workers_failing")
_QUOTE_CHARS = 240


def supervision_lines(log_text: str) -> dict[str, list[str]]:
    """The log's lines naming each supervision event (every event present, maybe empty)."""
    found: dict[str, list[str]] = {event: [] for event in SUPERVISION_EVENTS}
    for line in log_text.splitlines():
        for event in SUPERVISION_EVENTS:
            if event in line:
                found[event].append(line.strip())
    return found


def supervision_note(leg_name: str, log_path: Path) -> str:
    """One report line: how often each supervision event was logged, and the first of each."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError as exc:
        return f"- {leg_name}: gateway log {log_path} not read ({exc.strerror})."
    found = supervision_lines(text)
    counts = ", ".join(f"`{event}` {len(lines)}" for event, lines in found.items())
    quotes = "".join(
        f" First `{event}`: `{lines[0][:_QUOTE_CHARS]}`." for event, lines in found.items() if lines
    )
    return f"- {leg_name}: supervisor lines in the gateway log ({log_path.name}): {counts}.{quotes}"
