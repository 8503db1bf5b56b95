"""The field and media rules: what is forwarded, refused or dropped, per key scope and tier."""

from __future__ import annotations

from typing import Any

import pytest

from policies.errors import InvalidRequest
from policies.fields import (
    ENGINE_CONTROL_FIELDS,
    FieldPolicy,
    MediaUrl,
    check_address,
    check_fields,
    has_content_parts,
    media_urls,
    remote_host,
)
from policies.requests import json_depth


def body(**fields: Any) -> dict[str, Any]:
    """A minimal chat body with ``fields``."""
    return {"model": "fast", "messages": [{"role": "user", "content": "hi"}], **fields}


def check(
    b: dict[str, Any],
    *,
    engine: bool = False,
    structured: bool = True,
    policy: FieldPolicy | None = None,
) -> None:
    """check_fields for a chat body."""
    check_fields(
        b, "chat", policy or FieldPolicy(), engine_fields=engine, structured_outputs=structured
    )


def test_openai_fields_and_sampling_extras_pass() -> None:
    """OpenAI's own fields and documented extras need no scope."""
    b = body(
        temperature=0.1,
        top_k=5,
        min_p=0.05,
        repetition_penalty=1.1,
        tools=[],
        max_completion_tokens=5,
        stream_options={"include_usage": True},
        seed=1,
    )
    check(b)
    assert b["top_k"] == 5


@pytest.mark.parametrize("name", sorted(ENGINE_CONTROL_FIELDS))
def test_every_engine_field_needs_the_scope(name: str) -> None:
    """Each control field: 400 naming it without the scope, accepted with it."""
    with pytest.raises(InvalidRequest) as info:
        check(body(**{name: 1}))
    assert info.value.param == name
    check(body(**{name: 1}), engine=True)


def test_structured_outputs_follow_the_tier() -> None:
    """guided_json passes on a tier that supports structured outputs, else a 400."""
    check(body(guided_json={"type": "object"}))
    with pytest.raises(InvalidRequest, match="structured"):
        check(body(structured_outputs={"json": {}}), structured=False)


def test_unknown_fields_are_refused_or_dropped_by_policy() -> None:
    """Reject (default) names the field; drop removes it; allowed extras pass."""
    with pytest.raises(InvalidRequest) as info:
        check(body(mystery=1))
    assert info.value.param == "mystery"
    dropped = body(mystery=1)
    check(dropped, policy=FieldPolicy(unknown="drop"))
    assert "mystery" not in dropped
    check(body(mystery=1), policy=FieldPolicy(extra_allowed=frozenset({"mystery"})))


def test_completion_fields_differ_from_chat() -> None:
    """'prompt' and 'echo' are completion fields; 'messages' is not."""
    check_fields(
        {"model": "m", "prompt": "x", "echo": True},
        "completion",
        FieldPolicy(),
        engine_fields=False,
        structured_outputs=True,
    )
    with pytest.raises(InvalidRequest):
        check_fields(
            {"model": "m", "prompt": "x", "messages": []},
            "completion",
            FieldPolicy(),
            engine_fields=False,
            structured_outputs=True,
        )


def test_media_urls_are_found_in_every_part_kind() -> None:
    """image_url, audio_url, video_url, input_audio and file parts are all inspected."""
    parts = [
        {"type": "image_url", "image_url": {"url": "http://a/1"}},
        {"type": "audio_url", "audio_url": {"url": "http://a/2"}},
        {"type": "video_url", "video_url": "http://a/3"},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,AA=="}},
        {"type": "text", "text": "http://not-media"},
    ]
    found = media_urls({"messages": [{"role": "user", "content": parts}]})
    assert [m.url for m in found] == [
        "http://a/1",
        "http://a/2",
        "http://a/3",
        "data:application/pdf;base64,AA==",
    ]
    assert found[0].param == "messages[0].content[0]"


def test_remote_host_rules() -> None:
    """data: passes; other schemes never; remote only where allowed; literal IPs checked."""

    def m(url: str) -> MediaUrl:
        return MediaUrl("p", url)

    assert remote_host(m("data:image/png;base64,AA"), remote_allowed=False) is None
    assert remote_host(m("https://cdn.example/x.png"), remote_allowed=True) == ("cdn.example", 443)
    for url in ("file:///etc/passwd", "ftp://x/y", "javascript:alert(1)"):
        with pytest.raises(InvalidRequest):
            remote_host(m(url), remote_allowed=True)
    with pytest.raises(InvalidRequest, match="inline"):
        remote_host(m("https://cdn.example/x.png"), remote_allowed=False)
    with pytest.raises(InvalidRequest, match="metadata"):
        remote_host(m("http://169.254.169.254/"), remote_allowed=True)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.100.100.200",
        "0.0.0.0",
        "::1",
        "fd00:ec2::254",
        "fe80::1",
        "::ffff:10.0.0.1",
        "224.0.0.1",
    ],
)
def test_non_global_addresses_are_refused(address: str) -> None:
    """Every non-global address class (and IPv4-mapped forms) is refused."""
    with pytest.raises(InvalidRequest):
        check_address(MediaUrl("p", "x"), address)


def test_global_addresses_pass() -> None:
    """Public addresses are fine."""
    check_address(MediaUrl("p", "x"), "93.184.215.14")
    check_address(MediaUrl("p", "x"), "2606:4700::6810:85e5")


def test_json_depth_is_iterative_and_exact() -> None:
    """Depth counts nested containers; 100,000 levels do not exhaust the stack."""
    assert json_depth("x") == 0
    assert json_depth({"a": [1, {"b": []}]}) == 4
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert json_depth(deep) == 100_001


def test_content_parts_are_detected_in_any_message() -> None:
    """Only a list ``content`` has parts; the media and embedding checks rely on this."""
    text = {"role": "user", "content": "hi"}
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert not has_content_parts({"messages": [text, text]})
    assert not has_content_parts({"messages": "not a list"})
    assert not has_content_parts({"prompt": "x"})
    assert not has_content_parts({"messages": [None, 3, text]})
    assert has_content_parts({"messages": [text, parts]})
    assert has_content_parts({"messages": [{"role": "user", "content": []}]})
