"""The memory phase: a fresh gateway driven with good requests mixed with every kind of refusal.

Issue 11's P2 was memory kept after error responses, so the load that measures RSS growth is
not only good requests: one cycle of :data:`CYCLE` requests (wrk's ``request()`` hook walks it
in order, over and over) holds good completions and each refusal the gateway can give —
malformed JSON, a bad field, a bad key, a tier the key may not use, an unknown model, a body
over the limit, an upstream 400 passed through, and 3 MB bodies that are read in full and then
refused. RSS is read after each cumulative step (default 20k, then 200k requests).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from bench.harness.legs import Leg
from bench.harness.points import send_count
from bench.harness.processes import rss_mib
from bench.harness.wrk import (
    JSON_MARK,
    STATUS_MARK,
    WrkRunner,
    lua_string,
    parse_statuses,
)
from bench.overhead.report import MemoryMix, MemorySample
from bench.overhead.variants import MAX_BODY_BYTES

MEMORY_CONCURRENCY = 16
BIG_BODY_BYTES = 3_000_000  # read in full (under the limit), then refused
FILL = "x"


@dataclass(frozen=True)
class Kind:
    """One kind of request in the mix: what it sends, the status it must get, how often."""

    name: str
    status: int
    per_cycle: int
    needs_auth: bool = False


# Shares per cycle of 974: the 3 MB bodies are few (0.3 %) so a 200k-request run stays practical
# (~620 of them, ~1.8 GB read), but the cycle spreads them evenly, so every step sees them.
KINDS = (
    Kind("good completion", 200, 670),
    Kind("malformed JSON", 400, 50),
    Kind("bad field (messages is a string)", 400, 50),
    Kind("bad key", 401, 50, needs_auth=True),
    Kind("tier not allowed for the key", 403, 50, needs_auth=True),
    Kind("unknown model", 404, 50),
    Kind("upstream 400 passed through (stream_options without stream)", 400, 50),
    Kind("3 MB body, unknown model (read, then 404)", 404, 1),
    Kind("3 MB body, tier not allowed (read, then 403)", 403, 1, needs_auth=True),
    Kind("3 MB body, bad field (read, then 400)", 400, 1),
    Kind("body over the limit", 413, 1),
)
CYCLE = sum(k.per_cycle for k in KINDS)


@dataclass(frozen=True)
class Request:
    """One request of the cycle: headers, and a body as prefix + N filler bytes + suffix."""

    headers: dict[str, str]
    prefix: str
    fill: int
    suffix: str


def _body(model: str, content: str, **extra: object) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}], **extra})


def _split(body: str, fill: int) -> tuple[str, int, str]:
    """Cut a body at its filler marker so Lua can rebuild it with ``string.rep``."""
    if fill == 0:
        return body, 0, ""
    prefix, suffix = body.split("@FILL@")
    return prefix, fill, suffix


def kind_request(kind: Kind, leg: Leg) -> Request:
    """The request one kind sends to ``leg`` (its key, the restricted key, or a wrong one)."""
    headers = {"Content-Type": "application/json", **leg.headers}
    key = leg.api_key
    if kind.status == 401:
        key = "tg-bench-wrong.0000000000000000"
    elif kind.status == 403:
        key = leg.other_keys["fast-only"]
    if key:
        headers["Authorization"] = f"Bearer {key}"
    model, small = leg.model, "Say hello in five words."
    big = BIG_BODY_BYTES if kind.name.startswith("3 MB") else 0
    over = MAX_BODY_BYTES + 1_000_000 if kind.status == 413 else 0
    content = "@FILL@" if big or over else small
    body = {
        200: _body(model, content, max_tokens=16),
        401: _body(model, content, max_tokens=16),
        403: _body("precise", content, max_tokens=16),
        404: _body("no-such-model", content, max_tokens=16),
        413: _body(model, content, max_tokens=16),
    }.get(kind.status, "")
    if kind.name == "malformed JSON":
        body = '{"model": "' + model + '", "messages": [{"role": "user", "content": "hi"'
    elif kind.name.startswith("bad field") or kind.name.startswith("3 MB body, bad field"):
        body = json.dumps({"model": model, "messages": content, "max_tokens": 16})
    elif kind.name.startswith("upstream 400"):
        body = _body(model, content, max_tokens=16, stream_options={"include_usage": True})
    prefix, fill, suffix = _split(body, big or over)
    return Request(headers, prefix, fill, suffix)


def mix_for(leg: Leg, auth: bool) -> tuple[list[Kind], list[Request]]:
    """The kinds this gateway can be sent, and one cycle of requests with them interleaved."""
    kinds = [k for k in KINDS if auth or not k.needs_auth]
    slots: list[tuple[float, Kind]] = []
    for kind in kinds:
        slots += [((i + 0.5) / kind.per_cycle, kind) for i in range(kind.per_cycle)]
    slots.sort(key=lambda slot: slot[0])  # spread each kind evenly over the cycle
    return kinds, [kind_request(kind, leg) for _, kind in slots]


def _lua_table(headers: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items()) + "}"


_MIX_TEMPLATE = """\
local specs = {{
{specs}
}}
local path = {path}
local stop_after = {stop_after}
local threads = {{}}
local reqs = {{}}
local i = 0
seen = 0
counts = {{}}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  for _, s in ipairs(specs) do
    local body = s[2] .. string.rep("{fill}", s[3]) .. s[4]
    table.insert(reqs, wrk.format("POST", path, s[1], body))
  end
end

function request()
  i = i % #reqs + 1
  return reqs[i]
end

function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
  seen = seen + 1
  if stop_after > 0 and seen >= stop_after then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{mark}{{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, '
    .. '"status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, '
    .. '"mean_us": %.1f}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
  local parts = {{}}
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("counts")) do
      table.insert(parts, string.format('"%d": %d', status, n))
    end
  end
  io.write('{status_mark}{{' .. table.concat(parts, ", ") .. '}}\\n')
end
"""


def lua_mix_script(path: str, requests: list[Request], stop_after: int) -> str:
    """The wrk script that sends ``requests`` in a loop and counts answers by status."""
    specs = ",\n".join(
        f"  {{{_lua_table(r.headers)}, {lua_string(r.prefix)}, {r.fill}, {lua_string(r.suffix)}}}"
        for r in requests
    )
    return _MIX_TEMPLATE.format(
        specs=specs,
        path=lua_string(path),
        stop_after=stop_after,
        fill=FILL,
        mark=JSON_MARK,
        status_mark=STATUS_MARK,
    )


def drive(
    leg: Leg, runner: WrkRunner, requests: list[Request], target: int, statuses: dict[int, int]
) -> tuple[int, int]:
    """Send ``target`` requests of the mix at c=16: (requests answered, socket errors).

    The answers' statuses are added to ``statuses``.
    """
    run = send_count(
        runner,
        leg.chat_url,
        lambda remaining: lua_mix_script(leg.chat_path, requests, stop_after=remaining),
        MEMORY_CONCURRENCY,
        target,
    )
    for stdout in run.outputs:
        for status, count in parse_statuses(stdout).items():
            statuses[status] = statuses.get(status, 0) + count
    return run.requests, run.socket_errors


def measure_memory(
    leg: Leg, runner: WrkRunner, steps: tuple[int, ...], auth: bool
) -> tuple[list[MemorySample], MemoryMix]:
    """RSS of a fresh gateway process after each cumulative step of the mixed load."""
    pid = leg.main.listener_pid()
    kinds, requests = mix_for(leg, auth)
    mix = MemoryMix(
        kinds=[(k.name, k.status, k.per_cycle) for k in kinds],
        omitted=[k.name for k in KINDS if k not in kinds],
    )
    samples: list[MemorySample] = []
    served = 0
    for step in steps:
        began = time.monotonic()
        done, errors = drive(leg, runner, requests, step - served, mix.statuses)
        elapsed = time.monotonic() - began
        served += done
        mix.socket_errors += errors
        time.sleep(0.5)
        samples.append(MemorySample(served, rss_mib(pid), round(elapsed, 1)))
        seen = ", ".join(f"{s}: {n:,}" for s, n in sorted(mix.statuses.items()))
        print(
            f"  TierGate RSS after {served:,} requests: {samples[-1].rss_mib:.1f} MiB "
            f"(answers {seen}; socket errors {mix.socket_errors}; step {elapsed:.0f} s)",
            flush=True,
        )
    return samples, mix
