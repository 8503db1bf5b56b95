"""Attacks on the media URL policy (P7) that reach a backend today.

vLLM reads a content part without a ``type`` (or with a ``uuid``) by the media key it carries
(``vllm/entrypoints/chat_utils.py``: "Handle missing 'type' but provided direct URL fields"),
and fetches URLs with requests/urllib3 or aiohttp, whose URL parsers differ from
``urllib.parse``. The fallback and shadow paths send a body checked for one tier to another.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.stack import PRECISE_SIM, Backends, Stack, running_stack

pytestmark = pytest.mark.slow
METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
PUBLIC = "http://93.184.215.14/cat.png"


def _remote_media_on_fast(config: dict[str, Any], _backends: Backends) -> None:
    config["tiers"]["fast"]["allow_remote_media"] = True


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Real simulators and a gateway; fast allows remote media, precise keeps inline only."""
    with running_stack(configure=_remote_media_on_fast) as stack:
        yield stack


def chat(parts: list[dict[str, Any]], model: str = "fast") -> dict[str, Any]:
    """A chat body whose one user message has ``parts``."""
    return {
        "model": model,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}],
    }


def assert_refused_and_not_forwarded(stack: Stack, body: dict[str, Any]) -> None:
    """A 400 naming the part, and the backend never saw the request."""
    before = stack.fast.stats()["requests_total"] + stack.precise.stats()["requests_total"]
    resp = stack.post(body)
    assert resp.status_code == 400, (resp.status_code, resp.text)
    assert resp.json()["error"]["param"] == "messages[0].content[1]"
    after = stack.fast.stats()["requests_total"] + stack.precise.stats()["requests_total"]
    assert after == before


@pytest.mark.parametrize(
    "part",
    [
        {"image_url": {"url": METADATA}},
        {"image_url": METADATA},
        {"video_url": {"url": "http://127.0.0.1:6379/"}},
        {"audio_url": {"url": "http://10.0.0.5/a.wav"}},
    ],
)
def test_a_media_part_without_type_is_checked_like_a_typed_one(
    stack: Stack, part: dict[str, Any]
) -> None:
    """vLLM fetches an untyped part's image_url/video_url/audio_url: it must be checked too."""
    assert_refused_and_not_forwarded(stack, chat([part]))


def test_a_responses_style_input_image_part_is_checked(stack: Stack) -> None:
    """vLLM's MM_PARSER_MAP reads ``{"type": "input_image", "image_url": URL}`` and fetches it."""
    assert_refused_and_not_forwarded(stack, chat([{"type": "input_image", "image_url": METADATA}]))


@pytest.mark.parametrize("kind", ["image_embeds", "audio_embeds"])
def test_raw_embedding_parts_need_the_engine_fields_scope(stack: Stack, kind: str) -> None:
    """Serialized tensors go to torch.load in the engine, like the refused prompt_embeds."""
    tensor = "UEsDBAAACAgAAAAAAAAAAAAAAAAAAAAAAAAQABIAYXJjaGl2ZS9kYXRhLnBrbA=="
    assert_refused_and_not_forwarded(stack, chat([{"type": kind, kind: tensor}]))


def test_a_media_part_with_a_uuid_and_another_type_is_checked(stack: Stack) -> None:
    """With a ``uuid`` vLLM ignores ``type`` and reads ``image_url``: it must be checked too."""
    part = {"type": "text", "text": "x", "uuid": "u1", "image_url": {"url": METADATA}}
    assert_refused_and_not_forwarded(stack, chat([part]))


def test_an_untyped_remote_part_is_refused_where_the_tier_allows_inline_only(stack: Stack) -> None:
    """The precise tier allows inline media only; an untyped remote part slips past today."""
    before = stack.precise.stats()["requests_total"]
    resp = stack.post(chat([{"image_url": {"url": PUBLIC}}], model="precise"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "remote_media_not_allowed"
    assert stack.precise.stats()["requests_total"] == before


def test_a_backslash_authority_is_not_read_differently_by_the_fetcher(stack: Stack) -> None:
    """urllib3 (requests, vLLM's sync fetcher) reads http://127.0.0.1\\@8.8.8.8/ as 127.0.0.1."""
    from urllib3.util import parse_url

    url = "http://127.0.0.1\\@8.8.8.8/x.png"
    assert parse_url(url).host == "127.0.0.1"  # what the backend would connect to
    assert_refused_and_not_forwarded(
        stack, chat([{"type": "image_url", "image_url": {"url": url}}])
    )


def dead_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_fallback_does_not_carry_remote_media_to_a_tier_that_forbids_it() -> None:
    """Fast (remote media allowed) is down, precise (inline only) answers: no URL reaches it."""

    def fast_down(config: dict[str, Any], backends: Backends) -> None:
        config["tiers"]["fast"]["replicas"] = [f"http://127.0.0.1:{dead_port()}"]
        _remote_media_on_fast(config, backends)

    with running_stack(sims=[PRECISE_SIM], configure=fast_down) as stack:
        body = chat([{"type": "image_url", "image_url": {"url": PUBLIC}}])
        resp = stack.post(body, timeout=15)
        seen = stack.precise.stats()["last_request"]
    assert seen is None or PUBLIC not in str(seen), "precise fetched a remote URL"
    assert resp.status_code in (400, 503), (resp.status_code, resp.text)
    assert set(resp.json()["error"]) >= {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "url",
    [
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",  # NAT64 (RFC 6052) of 169.254.169.254
        "http://[64:ff9b::a00:5]/x.png",  # NAT64 of 10.0.0.5
        "http://[64:ff9b::7f00:1]/x.png",  # NAT64 of 127.0.0.1
        "http://[2002:a00:5::]/x.png",  # 6to4 of 10.0.0.5
        "http://[::ffff:0:a00:5]/x.png",  # IPv4-translated (SIIT) 10.0.0.5
    ],
)
def test_ipv6_forms_that_embed_a_private_ipv4_are_refused(stack: Stack, url: str) -> None:
    """On IPv6-only clusters with NAT64 these reach the embedded IPv4 address."""
    assert_refused_and_not_forwarded(
        stack, chat([{"type": "image_url", "image_url": {"url": url}}])
    )
