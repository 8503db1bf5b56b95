"""What a relayed stream has delivered so far: its tokens, its choices' final chunks, its usage.

:class:`StreamTally` is the counting half of :class:`~gateway.upstream.relay.StreamRelay` (its
base class: the counters stay plain attributes of the relay, read on every event and by the
pipeline). It counts a token per content chunk (a long one by its text: :func:`chunk_tokens`;
at most ``max_tokens`` per choice), notes
each choice's final chunk (a string ``finish_reason``; by ``index`` when several were asked
for), records the backend's ``usage`` (never below a token per content chunk) and drops the usage
chunk the gateway asked for on the caller's behalf, estimates usage for a backend that never
reports it in streams, and keeps the answer's text for a request sampled for shadow
evaluation.
"""

from __future__ import annotations

import re
import time

import msgspec

from gateway.pipeline.events import UNREADABLE_JSON, Usage
from gateway.upstream.attempt import generated_texts, usage_from
from gateway.upstream.sse import MAX_EVENT, first_choice_text, unasked
from policies.requests import text_tokens

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_SEP = b"\n\n"
# A chunk still generating (``"finish_reason": null``; JSON spaced any way).
_NO_FINISH = re.compile(rb'"finish_reason"\s*:\s*null')
# A choice's last chunk: its ``finish_reason`` is a string ("stop", "length", "tool_calls").
# An empty one counts too: TGI before 2.3 sends ``""`` on every /v1/completions chunk and no
# other final chunk, so its streams could never end complete otherwise.
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')
# Generated text in a chunk, not empty: content, a completion's text, thinking, a tool call.
_TEXT = re.compile(rb'"(?:content|text|reasoning(?:_content)?|name|arguments)"\s*:\s*"[^"]')
# The usual spelling of a chunk still generating, checked before the pattern above.
_NO_FINISH_COMPACT = b'"finish_reason":null'
_CHOICES = b'"choices"'  # in a chunk; not in an error event
# A chunk counts one token, unless it is longer than ``long_chunk`` bytes (a usual chunk of
# one token is 150 to 300 bytes, most of it an envelope the same on every chunk) and its text
# is more than ``_ONE_TOKEN`` tokens by the prompt estimate: then it counts that estimate. A
# tool parser that buffers a call's whole arguments (some of vLLM's, llama.cpp) sends
# kilobytes in one chunk. ``long_chunk`` starts at ``_LONG_CHUNK`` and, once two longer chunks
# turn out to hold one token (a long model name, logprobs), becomes the smaller envelope (a
# chunk less its text) plus ``_LONG_TEXT``: a stream's later chunks of one token are not
# decoded.
_LONG_CHUNK = 256
_LONG_TEXT = 32
_ONE_TOKEN = 8  # 32 ASCII characters: longer than a usual token, which counts 1


class StreamTally:
    """A stream's counts and usage, fed each ``data: {...}`` chunk (see the module)."""

    def __init__(
        self,
        *,
        strip_usage: bool,
        prompt_tokens: int,
        max_tokens: int | None,
        capture: bool,
        choices: int,
    ) -> None:
        # The answer's text, kept only for requests sampled for shadow evaluation.
        self.captured: list[str] | None = [] if capture else None
        self.usage: Usage | None = None
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.strip_usage = strip_usage
        self.token_events = 0  # tokens streamed by the gateway's count (long chunks estimated)
        self.chunk_events = 0  # content chunks streamed: each holds at least one token
        self.first_token_at = 0.0  # when the first token came (perf_counter(); 0.0: none yet)
        # Final chunks seen (a request for one choice needs one).
        self.finishes = 0
        self.choices = max(1, choices)
        # A request for several (``n``, a list of prompts): each choice the backend started,
        # by index, and whether its final chunk came. A backend may give fewer than asked
        # (llama-cpp-python and Ollama ignore ``n``); every one it started must finish.
        self.started: dict[int, bool] | None = {} if self.choices > 1 else None
        self.last_data = b""
        self.long_chunk = _LONG_CHUNK  # a chunk past this many bytes is decoded to be counted
        self._envelope = MAX_EVENT  # the smallest envelope of a decoded chunk of one token
        self._singles = 0  # decoded chunks of one token

    def _chunk(self, event: bytes) -> bool:
        """A ``data: {...}`` event: count its token, note a final chunk, capture its text;
        whether it names a ``finish_reason`` (a choice's chunk, not the backend's error)."""
        self.last_data = event
        choice = True
        if _NO_FINISH_COMPACT in event or _NO_FINISH.search(event):
            if b'"role"' not in event or _TEXT.search(event):  # Ollama: a role on every chunk
                self._count(event)
        elif _FINISH.search(event):
            self.finishes += 1
            if _TEXT.search(event):  # a final chunk that carries the last token
                self._count(event)
        else:
            choice = False
            # No ``finish_reason`` key (LiteLLM's chunks): one with text is a token still.
            if _CHOICES in event and _TEXT.search(event):
                self._count(event)
        if not self.first_token_at and self.token_events:
            self.first_token_at = time.perf_counter()
        if self.started is not None:
            self._track_choices(event)
        if self.captured is not None:
            self._capture(event)
        return choice

    def _count(self, event: bytes) -> None:
        """A content chunk: one more chunk, and its tokens (a long one its estimate)."""
        self.chunk_events += 1
        self.token_events += 1 if len(event) <= self.long_chunk else self._long(event)

    def _long(self, event: bytes) -> int:
        """A long chunk's tokens (:func:`chunk_tokens`); from the second of a single token on,
        ``long_chunk`` is the smallest such envelope plus ``_LONG_TEXT`` (no lower than
        ``_LONG_CHUNK``): a first chunk with 100 KB only it has (the prompt's token ids) would
        otherwise leave every later chunk under 100 KB undecoded, counted 1."""
        tokens, size = chunk_tokens(event)
        if tokens == 1:
            self._envelope = envelope = min(self._envelope, len(event) - size)
            self._singles += 1
            if self._singles > 1:  # not on the first alone, which may carry what only it has
                self.long_chunk = max(_LONG_CHUNK, envelope + _LONG_TEXT)
        return tokens

    def _track_choices(self, event: bytes) -> None:
        """Note each choice of the chunk by its index, and whether it is its final chunk."""
        started = self.started
        try:
            data = _decoder.decode(event[6:])
        except UNREADABLE_JSON:
            return
        choices = data.get("choices") if isinstance(data, dict) else None
        if started is None or not isinstance(choices, list):
            return
        for choice in choices:
            if isinstance(choice, dict) and type(index := choice.get("index", 0)) is int:
                reason = choice.get("finish_reason")
                started[index] = started.get(index, False) or isinstance(reason, str)

    def _finished(self) -> bool:
        """Did the backend finish its answer: one final chunk, or one for every choice of a
        request for several that it started?"""
        if self.started is None:
            return self.finishes > 0
        return bool(self.started) and all(self.started.values())

    def _usage_event(self, event: bytes) -> bytes | None:
        """An event that may carry ``usage``: recorded; usage the gateway asked for dropped."""
        try:
            data = _decoder.decode(event[6:])
        except UNREADABLE_JSON:
            return event
        usage = usage_from(data)
        if usage is not None:  # never below a token a chunk (a count that is no number: 0);
            # not the estimate of long chunks, a guess that may be above what was generated
            chunks = self._capped(self.chunk_events)
            usage.completion_tokens = max(usage.completion_tokens, chunks)
            self.usage = usage
            if self.strip_usage:  # asked for by the gateway: the caller sees none, also where
                return unasked(data)  # it rides on a chunk with choices (some servers)
        return event

    def _capture(self, event: bytes) -> None:
        text = first_choice_text(event)
        if text is not None and self.captured is not None:
            self.captured.append(text)

    def _streamed(self) -> int:
        """Completion tokens streamed, by the gateway's count: a content chunk (of any choice)
        a token (a long one its estimate: :func:`chunk_tokens`), at most ``max_tokens`` for
        each choice."""
        return self._capped(self.token_events)

    def _capped(self, tokens: int) -> int:
        """``tokens``, at most ``max_tokens`` for each choice."""
        if self.max_tokens is None:
            return tokens
        return min(tokens, self.max_tokens * self.choices)

    def _count_usage(self) -> Usage:
        """The gateway's own count: its prompt estimate and the tokens it streamed."""
        self.usage = usage = Usage(self.prompt_tokens, self._streamed())
        return usage

    def _estimated_usage(self) -> bytes:
        """Usage for a backend that never reports it in streams (llama.cpp's server).

        The prompt is the gateway's own estimate and the completion one token per content
        chunk (llama.cpp streams one token a chunk; a long chunk counts its estimate); it
        settles token limits and, when the caller asked for usage, goes out as the usage
        chunk vLLM would have sent.
        """
        usage = self._count_usage()
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        if self.strip_usage or not self.last_data:
            return b""
        try:
            last = _decoder.decode(self.last_data[6:])
        except UNREADABLE_JSON:
            return b""
        if not isinstance(last, dict):
            return b""
        chunk = {key: last[key] for key in ("id", "object", "created", "model") if key in last}
        chunk["choices"] = []
        chunk["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return b"data: " + _encoder.encode(chunk) + _SEP


def chunk_tokens(event: bytes) -> tuple[int, int]:
    """A long chunk's tokens and its text's size in bytes. The tokens are the prompt
    estimate of the text it adds to its choices (content, a completion's text, thinking, tool
    calls' names and arguments) where that is more than ``_ONE_TOKEN``, else 1 (a usual chunk
    with a long envelope)."""
    try:
        data = _decoder.decode(event[6:])
    except UNREADABLE_JSON:
        return 1, 0
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return 1, 0
    texts: list[str] = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        found = generated_texts(delta) if isinstance(delta, dict) else [choice.get("text")]
        texts.extend(text for text in found if isinstance(text, str) and text)
    tokens = sum(text_tokens(text) for text in texts)
    return (tokens if tokens > _ONE_TOKEN else 1), sum(len(text.encode()) for text in texts)
