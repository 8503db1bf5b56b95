"""A quality model, so shadow evaluation can be tested end to end (issue 17).

With ``--quality-file FILE`` (JSON lines with ``prompt`` and ``label``: ``simple`` or
``complex``) the reply to a prompt is a deterministic function of the prompt's text, the same
on every simulator — unless this simulator is ``--weak`` (the fast tier's stand-in) and the
prompt is labelled ``complex``: then it answers differently, as a quantized model that "gets
it wrong" would. Prompts are matched on their whitespace-normalized text (the last user
message of a chat, or a completion's prompt); unknown prompts count as simple.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


def _key(text: str) -> str:
    return " ".join(text.split())


def _digest(text: str, salt: str) -> int:
    data = hashlib.blake2b((salt + _key(text)).encode(), digest_size=8).digest()
    return int.from_bytes(data, "big")


@dataclass(frozen=True, slots=True)
class QualityModel:
    """Which prompts are hard, and whether this simulator gets them wrong."""

    hard: frozenset[str]
    weak: bool

    @classmethod
    def load(cls, path: Path, *, weak: bool) -> QualityModel:
        """Read the labelled prompts file."""
        hard: set[str] = set()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt, label = row["prompt"], row["label"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: need 'prompt' and 'label'") from exc
            if label == "complex":
                hard.add(_key(str(prompt)))
        return cls(frozenset(hard), weak)

    def wrong(self, prompt: str) -> bool:
        """True when this simulator answers ``prompt`` differently from a strong one."""
        return self.weak and _key(prompt) in self.hard

    def seed(self, prompt: str) -> int:
        """The seed of the reply's words: the prompt's, or another one when it gets it wrong."""
        return _digest(prompt, "wrong:" if self.wrong(prompt) else "right:")
