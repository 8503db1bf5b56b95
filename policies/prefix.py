"""The prefix key of a request: chained hashes of the leading blocks of its conversation.

vLLM's prefix cache is per replica, so requests that share a long leading part of their
rendered prompt should land on the same replica. The key is built from the **whole**
conversation prefix the engine will see: tool definitions, chat-template options and the
messages, with ``cache_salt`` seeding the chain as it seeds vLLM's block hashes (different
salts never share blocks). The salt is not part of the anchor's text: as long as a short
prompt, it would count as a shared context and key all of a tenant's short prompts alike.
The model is not part of this key because each tier has its own replicas and its strategy
seeds its rendezvous hash with the tier's served model.

Only the *anchor* of the conversation is hashed: the part that later requests are likely to
share, so that a whole family of requests maps to one key. ``lead`` is everything before the
first user message (tools, system/developer messages), ``first`` that user message.

* ``lead`` at least as long as ``first`` (a long shared context): a single-turn request keys on
  ``lead`` alone, so short questions after the same context agree; a conversation with history
  keys on ``lead + first``, so chats that share only the system prompt do not pile up.
* a short ``lead``: the first power-of-two number of blocks that fits in half of
  ``lead + first``. Every turn of a chat has the same first message, so the whole chat keys
  alike from its first turn on; prompts sharing a long leading document agree too.
* legacy completions: the same power-of-two half of the prompt.

The result is a tuple of chained 64-bit block hashes (BLAKE2b, stdlib): element ``i`` covers
blocks ``0..i``, so two requests share leading elements exactly as far as they share leading
blocks. Pure: no IO, no clocks, deterministic across processes and machines.

:func:`tenant_cache_salt` is the ``cache_salt`` the gateway writes into a tenant's requests
(``requests.prefix_cache_scope: tenant``): a replica's prefix cache answers a prompt from
blocks another tenant left there (``cached_tokens``, a shorter time to first token), which
tells the second tenant what the first one sent. Salted per tenant, the blocks never match
across tenants, and the prefix key, which hashes the salt, keys each tenant's families apart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_FIELD = "\x1f"
_RECORD = "\x1e"
_HASH_BYTES = 8
_HEADER_FIELDS = ("chat_template_kwargs", "tools")
SALT_PREFIX = "tg1-"


@dataclass(frozen=True, slots=True)
class PrefixConfig:
    """Block size (bytes of rendered UTF-8) and the most blocks hashed per request."""

    block_chars: int = 256
    max_blocks: int = 128

    def __post_init__(self) -> None:
        if self.block_chars < 1 or self.max_blocks < 1:
            raise ValueError("block_chars and max_blocks must be positive")


def _canonical(value: Any) -> str:
    """A stable text form of JSON-like data (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _header(body: Mapping[str, Any]) -> str:
    parts = [_canonical(body[name]) for name in _HEADER_FIELDS if body.get(name) is not None]
    return _FIELD.join(parts) + _RECORD


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            out.append(text if isinstance(text, str) else _canonical(part))
        return "\n".join(out)
    return _canonical(content)


def _message(message: Any) -> str:
    if not isinstance(message, Mapping):
        return _canonical(message) + _RECORD
    role = str(message.get("role", ""))
    text = role + _FIELD + _content(message.get("content"))
    for extra in ("name", "tool_calls", "tool_call_id"):
        value = message.get(extra)
        if value is not None:
            text += _FIELD + (value if isinstance(value, str) else _canonical(value))
    return text + _RECORD


def _first_user(messages: Sequence[Any]) -> int | None:
    for index, message in enumerate(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return index
    return None


def _half_power_of_two(data: bytes, block: int) -> bytes:
    """The first 2**k blocks of ``data`` with 2**k <= half its blocks (at least one block)."""
    blocks = -(-len(data) // block)
    budget = max(1, blocks // 2)
    keep = 1 << (budget.bit_length() - 1)
    return data[: keep * block]


def anchor_bytes(body: Mapping[str, Any], kind: str, config: PrefixConfig) -> bytes:
    """The rendered anchor of a validated chat or completion body (see the module doc)."""
    header = _header(body)
    block = config.block_chars
    if kind != "chat":
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else _canonical(prompt)
        return _half_power_of_two((header + text).encode(), block)
    messages = body.get("messages")
    if not isinstance(messages, list):
        return header.encode()
    user = _first_user(messages)
    if user is None:
        return (header + "".join(_message(m) for m in messages)).encode()
    lead = header + "".join(_message(m) for m in messages[:user])
    first = _message(messages[user])
    if len(lead) >= len(first):
        return (lead if user + 1 == len(messages) else lead + first).encode()
    return _half_power_of_two((lead + first).encode(), block)


def chain_hashes(data: bytes, block: int, max_blocks: int, seed: bytes = b"") -> tuple[int, ...]:
    """Chained hashes of the ``block``-byte blocks of ``data`` (the last one may be short),
    every one of them seeded with ``seed``."""
    hasher = hashlib.blake2b(digest_size=_HASH_BYTES, person=b"tiergate-prefix")
    if seed:
        hasher.update(len(seed).to_bytes(4, "big") + seed)
    out: list[int] = []
    end = min(len(data), block * max_blocks)
    for start in range(0, max(end, 1), block):
        hasher.update(data[start : start + block])
        out.append(int.from_bytes(hasher.copy().digest(), "big"))
    return tuple(out)


def prefix_blocks(
    body: Mapping[str, Any], kind: str, config: PrefixConfig | None = None
) -> tuple[int, ...]:
    """The chained leading-block hashes that identify ``body``'s cache family."""
    config = config or PrefixConfig()
    data = anchor_bytes(body, kind, config)
    salt = body.get("cache_salt")
    seed = b"" if salt is None else _canonical(salt).encode()
    return chain_hashes(data, config.block_chars, config.max_blocks, seed)


def tenant_cache_salt(tenant: str, caller_salt: Any = None) -> str:
    """The ``cache_salt`` forwarded for ``tenant``'s request that carried ``caller_salt``
    (``None``: none): a digest of both, so whatever a tenant sends, its requests never carry
    another tenant's salt, and a tenant's own salts still keep its requests apart."""
    hasher = hashlib.blake2b(digest_size=16, person=b"tiergate-salt")
    name = tenant.encode()
    hasher.update(len(name).to_bytes(4, "big") + name)
    if caller_salt is not None:
        hasher.update(b"\x01" + _canonical(caller_salt).encode())
    return SALT_PREFIX + hasher.hexdigest()
