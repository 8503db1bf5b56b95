"""Where prompts come from: a deterministic synthetic source, or the user's JSONL file."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.spec import SpecError

# Common English words that are one token in the usual BPE vocabularies (with their leading
# space), so that N words are close to N tokens on real servers too.
_WORDS = (
    "the",
    "time",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "name",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "back",
    "parent",
    "face",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "order",
    "long",
    "small",
    "good",
    "new",
    "first",
)

Messages = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's input: chat messages, or a completion prompt."""

    messages: Messages | None = None
    text: str | None = None

    def chat_messages(self) -> Messages:
        """The prompt as chat messages."""
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.text or ""}]


def synthetic(prompt_tokens: int, seed: int, tag: str) -> Iterator[Prompt]:
    """Endless prompts of about ``prompt_tokens`` words; the words depend only on the seed.

    Each starts with ``tag`` and its serial number: give every stream its own tag (a run id,
    the target, the grid point) and no prefix cache can serve one request from another, so
    TTFT measures a full prefill, in this run and in the next.
    """
    rng = random.Random(seed * 1_000_003 + prompt_tokens)  # noqa: S311 - test text, not security
    stream = hashlib.blake2s(tag.encode(), digest_size=4).hexdigest()
    serial = 0
    while True:
        head = f"Request {stream}-{serial}:"  # about 5 tokens
        words = [rng.choice(_WORDS) for _ in range(max(prompt_tokens - 5, 1))]
        yield Prompt(text=head + " " + " ".join(words))
        serial += 1


def _parse_line(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise SpecError(f"{where}: expected a JSON object with `prompt` or `messages`")
    if "messages" in obj:
        messages = obj["messages"]
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
                for m in messages
            )
        ):
            raise SpecError(
                f"{where}: `messages` must be a non-empty list of {{role, content}} objects"
            )
        return Prompt(messages=messages)
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise SpecError(f"{where}: expected a non-empty string `prompt` or a `messages` list")
    return Prompt(text=prompt)


def load_jsonl(path: Path, *, chat: bool) -> list[Prompt]:
    """Every line of ``path``: ``{"prompt": "..."}`` or ``{"messages": [...]}``."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SpecError(f"--prompts: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"--prompts: {path} is not UTF-8 text") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{where}: not JSON ({exc.msg})") from None
        prompt = _parse_line(obj, where)
        if prompt.messages is not None and not chat:
            raise SpecError(f"{where}: `messages` needs --endpoint chat")
        prompts.append(prompt)
    if not prompts:
        raise SpecError(f"--prompts: {path} has no prompts")
    return prompts


def cycle(prompts: list[Prompt]) -> Iterator[Prompt]:
    """The file's prompts in order, again and again."""
    while True:
        yield from prompts
