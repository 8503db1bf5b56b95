"""The shadow store's prompt digest is keyed with a deployment secret (issue 34)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from gateway.routing.shadow import ShadowConfig, digest_key, prompt_digest


def test_the_digest_is_keyed_and_not_the_unkeyed_hash() -> None:
    """One key: one digest per prompt (whitespace-normalised); another key, another digest;
    never the unkeyed BLAKE2b digest anyone can compute for a guess."""
    key, other = b"k" * 32, b"o" * 32
    assert prompt_digest("hi  there", key) == prompt_digest("hi there", key)
    assert prompt_digest("hi", key) != prompt_digest("hi", other)
    unkeyed = hashlib.blake2b(b"hi", digest_size=12).hexdigest()
    assert prompt_digest("hi", key) != unkeyed
    assert len(prompt_digest("hi", key)) == 24


def test_a_store_gets_one_generated_key_file_shared_by_every_runner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without digest_key_file, <store>.key is created once (mode 0600) and read again by the
    next runner (another worker, a restart), so digests of one prompt still match."""
    config = ShadowConfig(fast_ratio=1.0, store=tmp_path / "shadow.jsonl")
    first = digest_key(config)
    path = tmp_path / "shadow.jsonl.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert digest_key(config) == first
    assert len(first) >= 32


def test_a_configured_key_file_is_used_and_a_short_one_refused(tmp_path: Path) -> None:
    """digest_key_file wins; a key under 16 bytes is refused at start-up."""
    good, short = tmp_path / "good", tmp_path / "short"
    good.write_bytes(b"a-deployment-secret-of-32-bytes!\n")
    short.write_bytes(b"tiny")
    assert digest_key(ShadowConfig(digest_key_file=good)) == b"a-deployment-secret-of-32-bytes!"
    with pytest.raises(ValueError, match="16 bytes"):
        digest_key(ShadowConfig(digest_key_file=short))
    assert digest_key(ShadowConfig()) != digest_key(ShadowConfig())  # memory only: per process
