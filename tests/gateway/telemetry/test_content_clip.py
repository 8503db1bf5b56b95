"""Captured content is clipped (``telemetry.capture_content_max_chars``): a long prompt or a
long answer cannot make a span of megabytes, nor make the gateway hold a whole answer's text
while it streams; an upstream key cut by the clip is not left half visible."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Mapping

import msgspec
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config.settings import TelemetrySettings
from gateway.pipeline.context import RequestContext
from gateway.pipeline.events import AttemptEnd, AttemptStart
from gateway.telemetry.output_parts import OutputParts
from gateway.telemetry.tracing import Tracing, build_tracer_provider
from tests.gateway.telemetry.factories import summary

LIMIT = 1_000


def _spans(
    body: Mapping[str, object],
    answer: Mapping[str, object],
    *,
    secrets: tuple[str, ...] = (),
    capture: bool = True,
) -> dict[str, object]:
    """The client span's attributes for one traced request (content capture on by default;
    ``secrets``: the upstream keys the attempt was sent with)."""
    settings = TelemetrySettings(
        tracing=True, otel_env={}, capture_content=capture, capture_content_max_chars=LIMIT
    )
    exporter = InMemorySpanExporter()
    provider = build_tracer_provider(settings, exporter)
    assert provider is not None
    tracing = Tracing(
        provider,
        capture_content=capture,
        capture_content_max_chars=settings.capture_content_max_chars,
    )
    ctx = RequestContext("req-1", route="/v1/chat/completions")
    ctx.summary = summary()
    trace = ctx.trace = tracing.start(ctx, None, None)
    ctx.admitted = True
    start = AttemptStart(
        "fast", "127.0.0.1:9", "http://127.0.0.1:9", "round_robin", ctx.started, 0, None, "u1",
        body, secrets,
    )  # fmt: skip
    ctx.attempts = 1
    trace.attempt_started(ctx, start)
    trace.attempt_ended(ctx, AttemptEnd(0.001, body=json.dumps(answer).encode()))
    ctx.status = 200
    trace.finish(ctx, "complete")
    (client,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert client.attributes is not None
    return dict(client.attributes)


def _answer(text: str) -> dict[str, object]:
    message = {"role": "assistant", "content": text}
    return {"id": "c", "choices": [{"index": 0, "finish_reason": "stop", "message": message}]}


def _contents(messages: list[dict[str, object]]) -> str:
    return "".join(
        str(part.get("content", ""))
        for m in messages
        for part in m["parts"]  # type: ignore[attr-defined]
    )


def test_a_long_prompt_and_a_long_answer_are_clipped_and_the_span_says_so() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s" * 800},
            {"role": "user", "content": [{"type": "text", "text": "u" * 50_000}]},
        ],
    }
    attributes = _spans(body, _answer("a" * 200_000))
    inputs = json.loads(str(attributes["gen_ai.input.messages"]))
    outputs = json.loads(str(attributes["gen_ai.output.messages"]))
    assert _contents(inputs) == "s" * 800 + "u" * 200  # the first LIMIT characters, in order
    assert [m["role"] for m in inputs] == ["system", "user"]
    assert _contents(outputs) == "a" * LIMIT
    assert outputs[0]["finish_reason"] == "stop"
    assert attributes["tiergate.content.clipped"] is True
    assert len(str(attributes["gen_ai.output.messages"])) < LIMIT + 200


def test_content_within_the_bound_is_whole_and_not_marked() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * LIMIT}]}
    attributes = _spans(body, _answer("y" * LIMIT))
    assert _contents(json.loads(str(attributes["gen_ai.input.messages"]))) == "x" * LIMIT
    assert _contents(json.loads(str(attributes["gen_ai.output.messages"]))) == "y" * LIMIT
    assert "tiergate.content.clipped" not in attributes


def test_a_streamed_answer_holds_no_more_than_the_bound_while_it_runs() -> None:
    """100,000 chunks of 10 characters (1 MB of text): what is held stays near the bound."""
    parts = OutputParts(LIMIT)
    for _ in range(100_000):
        parts.add({"index": 0, "delta": {"content": "0123456789"}})
    held = sum(len(piece) for piece in parts.choices[0].text.pieces)
    assert held <= LIMIT
    assert parts.clipped
    assert _contents(json.loads(parts.encoded([]))) == "0123456789" * (LIMIT // 10)


def test_an_upstream_key_cut_by_the_clip_is_not_left_half_visible() -> None:
    """The key starts just before the bound: its whole is blanked or none of it is shown,
    whichever part (text, thinking, tool arguments) it is in, and however it was streamed."""
    key = "sk-upstream-clip-0123456789abcdef"
    for field in ("content", "reasoning_content", "arguments"):
        for cut in range(LIMIT - len(key), LIMIT + 1, 7):
            text = "z" * cut + key + "tail"
            parts = OutputParts(LIMIT, slack=len(key))
            for at in range(0, len(text), 5):
                piece = text[at : at + 5]
                if field == "arguments":
                    call = {"index": 0, "function": {"arguments": piece}}
                    parts.add({"index": 0, "delta": {"tool_calls": [call]}})
                else:
                    parts.add({"index": 0, "delta": {field: piece}})
            encoded = parts.encoded([], (key,))
            for length in range(6, len(key) + 1):
                assert key[:length] not in encoded, (field, cut, length)


def test_a_key_cut_by_the_bound_on_a_tool_call_id_is_not_left_partly_visible() -> None:
    """A backend's tool-call id is clipped at 256 characters: a key across that cut is
    blanked whole or not shown, as in the text."""
    key = "sk-upstream-id-0123456789abcdef"
    for start in range(256 - len(key), 257):
        call = {"id": "c" * start + key + "tail", "function": {"name": "f", "arguments": "{}"}}
        parts = OutputParts(LIMIT, slack=len(key))
        parts.add({"index": 0, "message": {"role": "assistant", "tool_calls": [call]}})
        (message,) = json.loads(parts.encoded([], (key,)))
        (shown,) = [p["id"] for p in message["parts"] if p["type"] == "tool_call"]
        assert len(shown) <= 256
        for length in range(6, len(key) + 1):
            assert key[:length] not in shown, (start, length)


def test_a_key_inside_another_key_does_not_leave_the_longer_one_partly_visible() -> None:
    """Two upstream keys where one holds the other (``team`` and ``team-2``, say): the longer
    is blanked whole whichever order the keys come in."""
    short, long = "sk-team-0123456789", "sk-team-0123456789-second-key"
    for secrets in ((short, long), (long, short)):
        parts = OutputParts(LIMIT, slack=len(long))
        parts.add({"index": 0, "message": {"content": f"a {long} b {short} c"}})
        (message,) = json.loads(parts.encoded([], secrets))
        assert message["parts"][0]["content"] == "a [REDACTED] b [REDACTED] c", secrets


def test_a_stream_of_one_character_pieces_holds_about_its_text_not_a_string_per_piece() -> None:
    """A tokenizer that writes one CJK character per chunk: 100,000 chunks, each decoded from
    its own event. What the answer holds is near its kept text (32,768 characters, 64 KB),
    not one string object of ~80 bytes per character (2.7 MB per stream)."""
    decoder = msgspec.json.Decoder()
    events = [
        msgspec.json.encode({"index": 0, "delta": {"content": chr(0x4E00 + i % 9000)}})
        for i in range(100_000)
    ]
    tracemalloc.start()
    try:
        parts = OutputParts(32_768, slack=64)
        for event in events:
            parts.add(decoder.decode(event))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert parts.clipped
    assert held < 8 * 32_768, held  # at most 8 bytes per character kept (UCS-2 text: 2)


def test_a_prompt_of_many_empty_messages_makes_a_small_span() -> None:
    """The bound is on the span, not only on its text: 200,000 empty messages (a 600 KB body,
    under server.max_body_bytes) made a 5 MB attribute, and 1.3 million one of 35 MB, which a
    collector refuses whole."""
    body: dict[str, object] = {"model": "m", "messages": [{}] * 200_000}
    attributes = _spans(body, _answer("ok"))
    assert len(str(attributes["gen_ai.input.messages"])) < 100 * LIMIT
    assert attributes["tiergate.content.clipped"] is True
    body = {"model": "m", "messages": [{"role": "user", "content": [{}] * 200_000}]}
    attributes = _spans(body, _answer("ok"))
    assert len(str(attributes["gen_ai.input.messages"])) < 100 * LIMIT
    assert attributes["tiergate.content.clipped"] is True


def test_thinking_sent_in_both_reasoning_fields_is_taken_once_and_a_key_in_it_blanked() -> None:
    """A backend that writes its thinking under both names (vLLM's ``reasoning`` and, for older
    clients, ``reasoning_content``, the same text): the part is the text once, not the pieces
    of both interleaved (``thinkthink sk-0 sk-0123...``), where a streamed key is never whole
    and was shown unblanked."""
    key = "sk-upstream-both-0123456789abcdef"
    text = f"think {key} done"
    streamed = OutputParts(LIMIT, slack=len(key))
    for at in range(0, len(text), 5):
        piece = text[at : at + 5]
        streamed.add({"index": 0, "delta": {"reasoning_content": piece, "reasoning": piece}})
    whole = OutputParts(LIMIT, slack=len(key))
    whole.add({"index": 0, "message": {"reasoning_content": text, "reasoning": text}})
    newer = OutputParts(LIMIT, slack=len(key))  # the older name empty: the newer one is read
    newer.add({"index": 0, "message": {"reasoning_content": "", "reasoning": text}})
    for parts in (streamed, whole, newer):
        (message,) = json.loads(parts.encoded([], (key,)))
        assert message["parts"] == [{"type": "reasoning", "content": "think [REDACTED] done"}]


def test_many_tool_calls_with_long_ids_are_bounded_while_they_stream_and_in_the_span() -> None:
    """128 choices of 128 tool calls, each with a 256-character id and no text: nothing was
    charged to the bound, so the stream held 10 MB and the span was 5 MB (clipped unset)."""
    decoder = msgspec.json.Decoder()
    events = [
        msgspec.json.encode(
            {
                "index": c,
                "delta": {
                    "tool_calls": [
                        {"index": k, "id": f"{c:03d}{k:03d}" * 43, "function": {"arguments": ""}}
                    ]
                },
            }
        )
        for c in range(128)
        for k in range(128)
    ]
    tracemalloc.start()
    try:
        parts = OutputParts(LIMIT, slack=32)
        for event in events:
            parts.add(decoder.decode(event))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    encoded = parts.encoded([])
    assert held < 1_000_000, held
    assert len(encoded) < 100 * LIMIT
    assert parts.clipped


def test_a_key_the_backend_writes_into_the_answers_id_model_or_reason_is_not_in_the_span() -> None:
    """Content capture on or off: the answer's ``id``, ``model`` and finish reason are span
    attributes of every traced request, so a key the backend echoes there is blanked too,
    also where the 256-character cut splits it."""
    key = "sk-upstream-echo-0123456789abcdef"
    for capture in (False, True):
        for pad in (0, 256 - 20, 300):
            answer = {
                "id": "x" * pad + key,
                "model": key,
                "choices": [{"index": 0, "finish_reason": key, "message": {"content": "hi"}}],
            }
            attributes = _spans(
                {"model": "m", "messages": []}, answer, secrets=(key,), capture=capture
            )
            shown = json.dumps({k: str(v) for k, v in attributes.items()})
            for length in range(6, len(key) + 1):
                assert key[:length] not in shown, (capture, pad, length)


def test_a_completions_prompt_given_as_a_list_of_strings_is_captured() -> None:
    """``/v1/completions`` takes ``prompt`` as a string or a list of them (a batch): each is a
    text part, under the same bound; token-id prompts are not text and are left out."""
    attributes = _spans({"model": "m", "prompt": ["first", "s" * 5_000, [1, 2, 3]]}, _answer("ok"))
    (message,) = json.loads(str(attributes["gen_ai.input.messages"]))
    assert [part["content"] for part in message["parts"]] == ["first", "s" * (LIMIT - 5)]
    assert attributes["tiergate.content.clipped"] is True
