"""Prefix keys: what a request's affinity key covers, and what it ignores."""

from __future__ import annotations

import time
from typing import Any

import pytest

from policies.prefix import (
    SALT_PREFIX,
    PrefixConfig,
    anchor_bytes,
    chain_hashes,
    prefix_blocks,
    tenant_cache_salt,
)

SYSTEM = "You are the support assistant of ACME. " * 60  # ~2.3 KB of shared context
CONFIG = PrefixConfig(block_chars=64, max_blocks=256)


def chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    """A chat body with ``(role, content)`` messages."""
    return {"model": "auto", "messages": [{"role": r, "content": c} for r, c in messages], **extra}


def key(body: dict[str, Any], kind: str = "chat") -> tuple[int, ...]:
    """The prefix blocks of ``body`` with the test block size."""
    return prefix_blocks(body, kind, CONFIG)


def test_blocks_are_chained_prefix_hashes() -> None:
    """Element i depends on blocks 0..i only: shared leading bytes give shared leading hashes."""
    a = chain_hashes(b"x" * 200 + b"tail-a", 64, 100)
    b = chain_hashes(b"x" * 200 + b"tail-b", 64, 100)
    assert a[:3] == b[:3]
    assert a[3] != b[3]
    assert len(a) == 4


def test_block_count_is_capped() -> None:
    """A huge prompt hashes at most max_blocks blocks (a bounded cost per request)."""
    assert len(chain_hashes(b"y" * 100_000, 64, 10)) == 10


def test_empty_anchor_still_has_a_key() -> None:
    """Even an empty anchor yields one block, so every request has a key."""
    assert len(chain_hashes(b"", 64, 10)) == 1


def test_shared_system_prompt_single_turn_requests_share_a_key() -> None:
    """Short questions after a long shared system prompt map to the same key."""
    one = key(chat(("system", SYSTEM), ("user", "How do I reset my password?")))
    two = key(chat(("system", SYSTEM), ("user", "Where is my invoice for March?")))
    assert one == two


def test_different_system_prompts_differ() -> None:
    """Groups with different shared contexts get different keys."""
    one = key(chat(("system", SYSTEM), ("user", "q")))
    two = key(chat(("system", SYSTEM.replace("ACME", "Initech")), ("user", "q")))
    assert one[-1] != two[-1]


def test_every_turn_of_a_conversation_has_the_same_key() -> None:
    """Turns 2..n of one chat share the anchor (system + first user message)."""
    first_user = ("user", "Here is my code, please review it: " + "def f(x): return x\n" * 20)
    turn2 = chat(
        ("system", "Be brief."),
        first_user,
        ("assistant", "Looks fine."),
        ("user", "And the tests?"),
    )
    turn3 = chat(
        ("system", "Be brief."),
        first_user,
        ("assistant", "Looks fine."),
        ("user", "And the tests?"),
        ("assistant", "Add some."),
        ("user", "Which?"),
    )
    assert key(turn2) == key(turn3)


def test_a_chat_with_a_short_system_prompt_keeps_its_key_from_turn_one() -> None:
    """With a short system prompt the first turn already has the key of the later turns."""
    first_user = ("user", "Please review this function for me: " + "x = compute(y)\n" * 30)
    turn1 = chat(("system", "Be brief."), first_user)
    turn4 = chat(
        ("system", "Be brief."),
        first_user,
        ("assistant", "ok"),
        ("user", "more"),
        ("assistant", "sure"),
        ("user", "and?"),
        ("assistant", "done"),
        ("user", "!"),
    )
    assert key(turn1) == key(turn4)


def test_long_system_prompt_chats_key_on_their_first_message_from_turn_two() -> None:
    """Single turns after a long system prompt share a key; chats split off by first message."""
    turn1 = chat(("system", SYSTEM), ("user", "My printer is broken."))
    turn2 = chat(
        ("system", SYSTEM),
        ("user", "My printer is broken."),
        ("assistant", "Hm."),
        ("user", "It is an LX-200."),
    )
    other = chat(("system", SYSTEM), ("user", "Billing question"))
    assert key(turn1) == key(other)
    assert key(turn2)[-1] != key(turn1)[-1]


def test_conversations_with_the_same_system_prompt_differ() -> None:
    """Two chats that only share the system prompt get different keys from turn 2 on."""
    a = chat(("system", SYSTEM), ("user", "Question A"), ("assistant", "x"), ("user", "more"))
    b = chat(("system", SYSTEM), ("user", "Question B"), ("assistant", "x"), ("user", "more"))
    assert key(a)[-1] != key(b)[-1]


def test_cache_salt_separates_tenants() -> None:
    """The same prompt with another cache_salt never shares a key (vLLM would not share KV)."""
    body = chat(("system", SYSTEM), ("user", "q"))
    assert key(body)[-1] != key({**body, "cache_salt": "tenant-b"})[-1]
    assert key({**body, "cache_salt": "t"})[-1] == key({**body, "cache_salt": "t"})[-1]


def test_a_salt_does_not_key_short_prompts_alike() -> None:
    """A salt seeds the chain but is no shared context: short single-turn prompts under one
    salt (every request of a tenant carries its salt) still get keys of their own."""
    salt = tenant_cache_salt("acme")
    keys = {key(chat(("user", f"question {n}"), cache_salt=salt)) for n in range(20)}
    assert len(keys) == 20


def test_a_tenant_salt_is_its_own_whatever_the_caller_sends() -> None:
    """The forwarded salt depends on the tenant and the caller's salt; no caller salt of one
    tenant gives another tenant's salt (names that differ by case, separators or a length
    boundary included), and the same tenant and salt always give the same one."""
    callers: list[Any] = [None, "", "acme", "x", 1, {"a": 1}, "acme\x01"]
    tenants = ["acme", "ACME", "acme ", "acm", "eacme", "acme|x", "x" * 200]
    salts = {(t, repr(c)): tenant_cache_salt(t, c) for t in tenants for c in callers}
    assert len(set(salts.values())) == len(salts)
    assert tenant_cache_salt("acme") == tenant_cache_salt("acme", None)
    assert tenant_cache_salt("acme", "s") == tenant_cache_salt("acme", "s")
    assert all(
        s.startswith(SALT_PREFIX) and len(s) == len(SALT_PREFIX) + 32 for s in salts.values()
    )


def test_tools_are_part_of_the_key() -> None:
    """Tool definitions are rendered into the prompt, so they are part of the key."""
    body = chat(("system", SYSTEM), ("user", "q"))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    assert key(body)[-1] != key({**body, "tools": tools})[-1]


def test_tool_key_order_does_not_matter() -> None:
    """Tools are rendered canonically: the same definitions in another key order agree."""
    body = chat(("user", "q"))
    one = [{"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}]
    two = [{"function": {"parameters": {"b": 2, "a": 1}, "name": "f"}, "type": "function"}]
    assert key({**body, "tools": one}) == key({**body, "tools": two})


def test_sampling_fields_and_model_are_ignored() -> None:
    """Temperature, max_tokens, stream and the model name do not move a request."""
    body = chat(("system", SYSTEM), ("user", "q"))
    other = {**body, "temperature": 0.1, "max_tokens": 9, "stream": True, "model": "fast"}
    assert key(body) == key(other)


def test_long_shared_document_in_one_user_message() -> None:
    """Without a system prompt, prompts sharing a long leading document share a key."""
    doc = "Clause 7: the supplier shall deliver the goods. " * 80
    one = key(chat(("user", doc + "Summarise clause 7.")))
    two = key(chat(("user", doc + "Who is the supplier, and what must they deliver?")))
    assert one == two


def test_short_unrelated_prompts_spread() -> None:
    """Unrelated short prompts get different keys (nothing to keep together)."""
    keys = {
        key(chat(("user", f"Question number {i} about something else entirely")))[-1]
        for i in range(20)
    }
    assert len(keys) == 20


def test_completion_prompts_with_a_shared_prefix() -> None:
    """Legacy completions key on the leading half of the prompt, rounded to 2**k blocks."""
    doc = "A" * 3000
    assert key({"prompt": doc + "one"}, "completion") == key({"prompt": doc + "two?"}, "completion")
    assert len(anchor_bytes({"prompt": doc}, "completion", CONFIG)) == 16 * 64


def test_multimodal_parts_are_rendered() -> None:
    """List content parts are rendered (text as text, other parts canonically)."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    one = chat(("user", "q"))
    one["messages"][0]["content"] = [{"type": "text", "text": "look"}, image]
    two = chat(("user", "q"))
    two["messages"][0]["content"] = [
        {"type": "text", "text": "look"},
        {**image, "image_url": {"url": "https://example.com/b.png"}},
    ]
    assert key(one) != key(two)


def test_config_rejects_nonsense() -> None:
    """A zero block size is refused."""
    with pytest.raises(ValueError, match="positive"):
        PrefixConfig(block_chars=0)


def test_key_cost_is_small() -> None:
    """A 32 KB conversation's key costs well under a millisecond (hot-path budget)."""
    history = [("user" if i % 2 == 0 else "assistant", "word " * 400) for i in range(16)]
    body = chat(("system", SYSTEM), *history)
    config = PrefixConfig()
    runs = 200
    started = time.perf_counter()
    for _ in range(runs):
        prefix_blocks(body, "chat", config)
    per_call = (time.perf_counter() - started) / runs
    assert per_call < 0.001
