"""The two prefix-routing workloads, generated from a seed so every strategy sees the same one.

* **grouped**: ``groups`` long shared contexts (system prompts), each followed by short
  questions; requests from all groups arrive interleaved in a random order.
* **chats**: ``conversations`` multi-turn chats of varied length, each with its own short
  system prompt; each turn appends the previous answer and a new, fairly long user message,
  so the history grows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

_WORDS = (
    "account",
    "invoice",
    "shipment",
    "policy",
    "refund",
    "warranty",
    "device",
    "network",
    "server",
    "replica",
    "cluster",
    "tenant",
    "quota",
    "latency",
    "token",
    "cache",
    "prefix",
    "router",
    "tier",
    "model",
    "prompt",
    "answer",
    "review",
    "contract",
    "clause",
    "supplier",
    "customer",
    "order",
    "ticket",
    "support",
    "engineer",
    "release",
    "version",
    "feature",
    "option",
    "setting",
    "limit",
    "budget",
    "report",
    "summary",
    "table",
    "column",
    "value",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "for",
    "with",
    "on",
    "by",
    "is",
    "are",
    "was",
    "be",
)


def text(rng: random.Random, words: int) -> str:
    """``words`` random words with a full stop every dozen or so (about one token each)."""
    out: list[str] = []
    for index in range(words):
        out.append(rng.choice(_WORDS))
        if index % 12 == 11:
            out[-1] += "."
    return " ".join(out)


@dataclass(frozen=True)
class Grouped:
    """Shared-context groups with short questions."""

    bodies: list[dict[str, Any]]
    groups: int


def grouped(
    *,
    groups: int,
    per_group: int,
    context_words: int,
    question_words: int,
    max_tokens: int,
    seed: int,
) -> Grouped:
    """``groups * per_group`` chat bodies in a shuffled order."""
    rng = random.Random(seed)
    contexts = [f"Group {g} reference manual. " + text(rng, context_words) for g in range(groups)]
    bodies = [
        {
            "model": "fast",
            "messages": [
                {"role": "system", "content": contexts[g]},
                {"role": "user", "content": f"Question {i}: " + text(rng, question_words)},
            ],
            "max_tokens": max_tokens,
            "stream": True,
        }
        for g in range(groups)
        for i in range(per_group)
    ]
    rng.shuffle(bodies)
    return Grouped(bodies, groups)


@dataclass(frozen=True)
class Chat:
    """One conversation: its system prompt and the user message of every turn."""

    system: str
    user_turns: list[str]


def chats(
    *, conversations: int, turns: int, user_words: int, seed: int, spread: float = 0.0
) -> list[Chat]:
    """``conversations`` scripted chats of ``turns`` turns on average.

    With ``spread`` > 0 the lengths vary uniformly within ``turns * (1 +- spread)``.
    """
    rng = random.Random(seed)
    low = max(2, round(turns * (1 - spread)))
    high = max(low, round(turns * (1 + spread)))
    out = []
    for c in range(conversations):
        # Each chat's system prompt carries its user's context (as a support assistant's
        # would), so chats share no leading block; shared prefixes are the grouped workload.
        system = f"You assist customer {c}. Their notes: " + text(rng, 12)
        length = rng.randint(low, high)
        out.append(
            Chat(
                system,
                [f"Conversation {c}, turn {t}: " + text(rng, user_words) for t in range(length)],
            )
        )
    return out


def chat_body(chat: Chat, history: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """The request for the next turn: system prompt, the history so far, streaming."""
    return {
        "model": "fast",
        "messages": [{"role": "system", "content": chat.system}, *history],
        "max_tokens": max_tokens,
        "stream": True,
    }
