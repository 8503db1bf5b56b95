"""An answer's output as ``gen_ai.output.messages`` holds it (``telemetry.capture_content``).

Each choice becomes one assistant message whose parts are what it generated: its thinking
(``reasoning_content``, or ``reasoning`` in newer vLLM) as a ``reasoning`` part, its text as a
``text`` part, and each tool call (the older ``function_call`` too) as a ``tool_call`` part
with its id, name and arguments (the string the model wrote). A stream's pieces are joined
per choice, and a streamed tool call's pieces by its ``index``. Everything here goes into the
same attribute as the text, under the same opt-in; nothing else is read. An upstream key the
backend wrote into its answer is blanked (secrets never in spans).

The text kept is bounded (``telemetry.capture_content_max_chars``): pieces past the bound are
not held while the answer streams, and the attribute holds at most that many characters of
content (``clipped`` says some were left out). A key the bound cuts is never left half visible:
a part cut while it streamed keeps ``slack`` more characters (the longest key), is blanked
whole, and loses those characters again before it is shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgspec

from gateway.upstream.attempt import REASONING_FIELDS

_encoder = msgspec.json.Encoder()
# What a backend chooses (an answer's id and model, its finish reasons, a tool call's id) is
# clipped: one answer with a megabyte id would otherwise make a span of megabytes, which the
# span queue holds thousands of and a collector refuses whole (with the other spans of its
# batch).
MAX_BACKEND_STRING = 256
# Choices of an answer, and tool calls of a choice, kept (by the backend's ``index``); later
# ones are left out. A backend numbers them itself: one that gives every chunk a new index
# would otherwise make a span of as many messages (10,000 empty chunks: 790 KB of span and
# 3 MB held while the stream runs). 128 is the most finish reasons a span keeps, and the
# most tools OpenAI's API takes in one request.
MAX_PARTS = 128
REDACTED = "[REDACTED]"
DEFAULT_MAX_CHARS = 32_768
# Entries (messages and parts of a prompt; choices and tool calls of an answer) kept in all:
# those hold no text of their own, and a body of empty messages, or an answer of 16,384
# tool calls, made a span of megabytes at any bound on the text.
MAX_ENTRIES = 1_024
# A part's pieces are joined this many at a time: a stream of one character per chunk would
# otherwise hold a string object (~80 bytes) per character kept.
_JOIN_EVERY = 64


class Room:
    """Characters of content, and entries, that may still be kept; ``clipped`` once a piece
    did not fit or an entry was refused."""

    __slots__ = ("clipped", "entries", "left")

    def __init__(self, chars: int) -> None:
        self.left = chars
        self.entries = MAX_ENTRIES
        self.clipped = False

    def enter(self) -> bool:
        """Room for one more entry: not once ``MAX_ENTRIES`` were made, nor once the text
        ran out (the entry's would be left out too)."""
        if self.entries and not self.clipped:
            self.entries -= 1
            return True
        self.clipped = True
        return False

    def take(self, text: str) -> str:
        """``text``, or as much of its start as there is room for."""
        if len(text) <= self.left:
            self.left -= len(text)
            return text
        self.clipped = True
        kept = text[: self.left]
        self.left = 0
        return kept


class _Text:
    """One part's text, put together from its pieces while the room lasts."""

    __slots__ = ("cut", "loose", "pieces", "room")

    def __init__(self, room: Room) -> None:
        self.room = room
        self.pieces: list[str] = []
        self.loose = 0  # pieces at the end of ``pieces`` not joined yet
        self.cut = False  # a piece of it did not fit

    def add(self, piece: str) -> None:
        room = self.room
        if not room.left:  # past the bound: nothing more is held
            if piece:
                room.clipped = self.cut = True
            return
        kept = room.take(piece)
        if kept:
            self.pieces.append(kept)
            self.loose += 1
            if self.loose == _JOIN_EVERY:
                self.pieces[-_JOIN_EVERY:] = ["".join(self.pieces[-_JOIN_EVERY:])]
                self.loose = 0
        self.cut |= len(kept) < len(piece)

    def __bool__(self) -> bool:
        return bool(self.pieces)

    def shown(self, secrets: tuple[str, ...], slack: int, room: Room) -> str:
        """The text blanked, less what a cut key could be in, as much as ``room`` takes."""
        return room.take(_trimmed("".join(self.pieces), secrets, slack, cut=self.cut))


def _blank(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` in it replaced by ``[REDACTED]``: the longest first,
    so a key inside another does not leave the rest of the longer one shown."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _trimmed(text: str, secrets: tuple[str, ...], slack: int, *, cut: bool) -> str:
    """``text`` blanked; when it was ``cut``, less its last ``slack`` characters (where the
    start of a key the cut split could be)."""
    text = _blank(text, secrets)
    if cut and slack:
        text = text[: max(0, len(text) - slack)]
    return text


def backend_string(text: str, secrets: tuple[str, ...], slack: int) -> str:
    """A string the backend chose (an answer's id or model, a finish reason, a tool call's
    id): at most ``MAX_BACKEND_STRING`` characters, each of ``secrets`` blanked whole, also
    one the cut splits (``slack``: the longest of them)."""
    if not secrets:
        return text[:MAX_BACKEND_STRING]
    kept = text[: MAX_BACKEND_STRING + slack]
    return _trimmed(kept, secrets, slack, cut=len(kept) < len(text))[:MAX_BACKEND_STRING]


_Part = TypeVar("_Part")


def _kept(parts: dict[int, _Part], key: int, new: Callable[[], _Part], room: Room) -> _Part | None:
    """The part under ``key``, made if fewer than ``MAX_PARTS`` are kept and ``room`` has an
    entry for it; else ``None``."""
    part = parts.get(key)
    if part is None and len(parts) < MAX_PARTS and room.enter():
        part = parts[key] = new()
    return part


class _Call:
    """One tool call, put together from its pieces."""

    __slots__ = ("arguments", "id", "id_cut", "name", "room", "slack")

    def __init__(self, room: Room, slack: int) -> None:
        self.id = ""
        self.id_cut = False
        self.room = room
        self.slack = slack
        self.name = _Text(room)
        self.arguments = _Text(room)

    def add(self, call: Mapping[str, Any], function: Any) -> None:
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id and not self.id:
            # Longer than shown by the longest key: one the cut splits is blanked whole. The
            # first id sent is kept (a backend may repeat it), charged to the room.
            self.id = self.room.take(call_id[: MAX_BACKEND_STRING + self.slack])
            self.id_cut = len(self.id) < len(call_id)
        if isinstance(function, dict):
            for field, parts in (("name", self.name), ("arguments", self.arguments)):
                value = function.get(field)
                if isinstance(value, str):
                    parts.add(value)

    def part(self, secrets: tuple[str, ...], slack: int, room: Room) -> dict[str, Any]:
        name = self.name.shown(secrets, slack, room)
        part: dict[str, Any] = {"type": "tool_call", "name": name}
        if self.id:
            shown = _trimmed(self.id, secrets, slack, cut=self.id_cut)
            part["id"] = shown[:MAX_BACKEND_STRING]
        part["arguments"] = self.arguments.shown(secrets, slack, room)
        return part


class _Choice:
    """What one choice generated so far."""

    __slots__ = ("calls", "finish_reason", "reasoning", "room", "slack", "text")

    def __init__(self, room: Room, slack: int) -> None:
        self.room = room
        self.slack = slack
        self.reasoning = _Text(room)
        self.text = _Text(room)
        self.calls: dict[int, _Call] = {}
        self.finish_reason = ""

    def add(self, message: Mapping[str, Any]) -> None:
        """A chat delta or message: its text, thinking and tool calls."""
        content = message.get("content")
        if isinstance(content, str):
            self.text.add(content)
        for field in REASONING_FIELDS:  # the first only: a backend may send both (the same)
            value = message.get(field)
            if isinstance(value, str) and value:
                self.reasoning.add(value)
                break
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    index = call.get("index", position)
                    key = index if type(index) is int else position
                    if entry := _kept(self.calls, key, self._call, self.room):
                        entry.add(call, call.get("function"))
        legacy = message.get("function_call")
        if isinstance(legacy, dict) and (entry := _kept(self.calls, -1, self._call, self.room)):
            entry.add({}, legacy)

    def _call(self) -> _Call:
        return _Call(self.room, self.slack)

    def message(self, secrets: tuple[str, ...], slack: int, room: Room) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if self.reasoning:
            reasoning = self.reasoning.shown(secrets, slack, room)
            parts.append({"type": "reasoning", "content": reasoning})
        text = self.text.shown(secrets, slack, room)
        if text or not (parts or self.calls):
            parts.append({"type": "text", "content": text})
        parts.extend(self.calls[key].part(secrets, slack, room) for key in sorted(self.calls))
        reason = backend_string(self.finish_reason, secrets, slack)
        return {"role": "assistant", "parts": parts, "finish_reason": reason}


class OutputParts:
    """The output of an answer, by choice, fed each choice of its chunks (or its whole
    answer's choices)."""

    __slots__ = ("_shown_clipped", "choices", "limit", "room", "slack")

    def __init__(self, limit: int = DEFAULT_MAX_CHARS, *, slack: int = 0) -> None:
        """``limit``: characters of content shown; ``slack``: the longest key to blank."""
        self.choices: dict[int, _Choice] = {}
        self.limit = limit
        self.slack = slack
        self.room = Room(limit + slack)  # what is held while the answer comes
        self._shown_clipped = False

    @property
    def clipped(self) -> bool:
        """Some content was left out (while it came, or by the last ``encoded``)."""
        return self.room.clipped or self._shown_clipped

    def _choice(self) -> _Choice:
        return _Choice(self.room, self.slack)

    def add(self, choice: Mapping[str, Any]) -> None:
        """One choice of a chunk or of a whole answer."""
        index = choice.get("index", 0)
        key = index if type(index) is int else 0
        entry = _kept(self.choices, key, self._choice, self.room)
        if entry is None:
            return
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            entry.finish_reason = reason[: MAX_BACKEND_STRING + self.slack]
        message = choice.get("delta") or choice.get("message")
        if isinstance(message, dict):
            entry.add(message)
        elif isinstance(text := choice.get("text"), str):
            entry.text.add(text)

    def encoded(self, reasons: list[str], secrets: tuple[str, ...] = ()) -> str:
        """``gen_ai.output.messages``: a message per choice (one, empty, when none came), each
        of ``secrets`` (the upstream keys) blanked."""
        choices = [self.choices[key] for key in sorted(self.choices)] or [self._choice()]
        shown = Room(self.limit)
        messages = [choice.message(secrets, self.slack, shown) for choice in choices]
        self._shown_clipped = shown.clipped
        if reasons and not messages[0]["finish_reason"]:
            messages[0]["finish_reason"] = reasons[0]
        return _encoder.encode(messages).decode()
