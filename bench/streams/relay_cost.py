"""CPU per event of the stream relay alone (``gateway.upstream.relay``), without sockets.

A fake backend answer hands the relay one event per read (as at 20 tokens/s) and the relay's
output is drained as the native writer would; the result is CPU time per event, the best of
``--rounds``. ``--usage-null`` puts ``"usage": null`` on every chunk (OpenAI's and SGLang's
shape with ``include_usage``). ``--cjk`` streams Chinese text, written as raw UTF-8 as vLLM
writes it (the relay's JSON check also checks such data is UTF-8). ``--tree`` imports the
gateway from another checkout (e.g. a ``git worktree`` of an older commit) for an A/B.

Run: ``.venv/bin/python bench/streams/relay_cost.py [--usage-null] [--cjk] [--tree PATH]``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FINAL = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'


def token(number: int, usage_null: bool, cjk: bool = False) -> bytes:
    """One content chunk as vLLM writes it (compact JSON, text outside ASCII as UTF-8)."""
    text = f"汉字{number}" if cjk else f"@{number} "
    doc: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None,
                     "finish_reason": None}],
    }  # fmt: skip
    if usage_null:
        doc["usage"] = None
    return b"data: " + json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class Answer:
    """A backend's answer that gives one prepared read per ``readany``."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = iter(reads)

    async def readany(self) -> bytes:
        """The next read, ``b""`` at the end."""
        return next(self.reads, b"")

    def close(self) -> None:
        """Nothing to close."""

    def release(self) -> None:
        """Nothing to release."""


def exchange(reads: list[bytes]) -> Any:
    """What the relay reads from: the answer, a replica and a pool that count nothing."""
    replica = SimpleNamespace(truncated=Counter(), heard_at=0.0, name="r")
    pool = SimpleNamespace(tier="fast", release=lambda _r: None)
    return SimpleNamespace(opened=SimpleNamespace(response=Answer(reads)), replica=replica,
                           pool=pool, first_event=b"", framing=None, deadline=math.inf,
                           finish=lambda **_: None)  # fmt: skip


async def one_round(relay_class: Any, events: int, usage_null: bool, cjk: bool = False) -> float:
    """CPU microseconds per event of one relayed answer."""
    reads = [token(i, usage_null, cjk) for i in range(events)] + [FINAL, USAGE, b"data: [DONE]\n\n"]
    relay = relay_class(exchange(reads), strip_usage=True, idle_s=30.0,
                        on_close=lambda _o, _u: None)  # fmt: skip
    start = time.process_time()
    async for _chunk in relay:
        pass
    spent = time.process_time() - start
    if not relay.complete:
        raise RuntimeError(f"the answer did not complete: {relay.outcome}")
    return spent / events * 1e6


async def measure(args: argparse.Namespace) -> float:
    """The best round."""
    from gateway.upstream.relay import StreamRelay  # noqa: PLC0415  # after --tree is on the path

    return min([await one_round(StreamRelay, args.events, args.usage_null, args.cjk)
                for _ in range(args.rounds)])  # fmt: skip


def main() -> None:
    """Parse arguments, measure, print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--usage-null", action="store_true")
    parser.add_argument("--cjk", action="store_true", help="Chinese text, as raw UTF-8")
    parser.add_argument("--tree", type=Path, default=None, help="a checkout to import from")
    args = parser.parse_args()
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    import uvloop  # noqa: PLC0415

    per_event = uvloop.run(measure(args))
    print(f"{per_event:.2f} µs CPU per event (usage null: {args.usage_null}, cjk: {args.cjk})")


if __name__ == "__main__":
    main()
