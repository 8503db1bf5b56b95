"""`tiergate keys` against a real key file and a real Redis."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.access.keys_cli import main
from gateway.access.keystore_file import FileKeyStore
from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import KNOWN_SCOPES
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command in-process; returns (code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_create_prints_the_key_last_and_stores_only_its_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The key is the last stdout line; the file holds its policy and digest."""
    path = tmp_path / "keys.yaml"
    code, out, _ = run(
        capsys,
        "create",
        "--keys-file",
        str(path),
        "--tenant",
        "search",
        "--name",
        "bot",
        "--tiers",
        "fast",
        "--rpm",
        "60",
        "--tpm",
        "5000",
        "--max-tokens",
        "512",
        "--concurrency",
        "4",
        "--expires-in",
        "30",
        "--scope",
        "route_override",
    )
    assert code == 0
    key = out.strip().splitlines()[-1]
    assert key.startswith("tg-")
    (record,) = FileKeyStore(path).records()
    assert record.matches(key, None)
    assert record.policy.rpm == 60
    assert record.policy.allowed_tiers == frozenset({"fast"})
    assert record.policy.scopes == frozenset({"route_override"})
    assert key not in path.read_text()


def test_list_never_shows_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Listings (text and JSON) show ids and policies, never keys or digests."""
    path = tmp_path / "keys.yaml"
    _, out, _ = run(capsys, "create", "--keys-file", str(path), "--tenant", "t", "--rpm", "5")
    key = out.strip().splitlines()[-1]
    _, text, _ = run(capsys, "list", "--keys-file", str(path))
    _, raw, _ = run(capsys, "list", "--keys-file", str(path), "--json")
    (item,) = json.loads(raw)
    assert item["status"] == "active"
    assert item["id"] in text
    for listing in (text, raw):
        assert key not in listing
        assert key.rsplit("-", 1)[1] not in listing
        assert "sha256" not in listing


def test_revoke_and_rotate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rotate prints a new key for the same id; revoke disables; unknown ids fail."""
    path = tmp_path / "keys.yaml"
    _, out, _ = run(capsys, "create", "--keys-file", str(path), "--tenant", "t")
    old = out.strip().splitlines()[-1]
    key_id = old.split("-")[1]
    code, out, _ = run(capsys, "rotate", key_id, "--keys-file", str(path))
    new = out.strip().splitlines()[-1]
    assert code == 0
    assert new != old
    assert new.split("-")[1] == key_id
    (record,) = FileKeyStore(path).records()
    assert record.matches(new, None)
    assert not record.matches(old, None)
    assert run(capsys, "revoke", key_id, "--keys-file", str(path))[0] == 0
    assert FileKeyStore(path).records()[0].disabled
    code, _, err = run(capsys, "revoke", "nosuchkey", "--keys-file", str(path))
    assert code == 1
    assert "nosuchkey" in err


def test_bad_options_fail_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid limits or scopes exit 2 with a message and create nothing."""
    path = tmp_path / "keys.yaml"
    code, _, err = run(capsys, "create", "--keys-file", str(path), "--tenant", "t", "--rpm", "0")
    assert code == 2
    assert "rpm" in err
    code, _, err = run(
        capsys, "create", "--keys-file", str(path), "--tenant", "t", "--scope", "admin"
    )
    assert code == 2
    assert not path.exists()


def test_tiers_are_checked_against_a_config_or_flagged_as_unchecked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --config a tier the gateway lacks is refused (exit 2, nothing written); without
    one the key is created and stderr says its tiers were not checked."""
    path = tmp_path / "keys.yaml"
    config = Path(__file__).parents[3] / "config" / "tiergate.sim.yaml"
    create = ("create", "--keys-file", str(path), "--tenant", "t", "--tiers", "turbo")
    code, _, err = run(capsys, *create, "--config", str(config))
    assert code == 2
    assert "unknown tiers ['turbo']" in err
    assert not path.exists()
    code, out, err = run(capsys, *create)
    assert code == 0
    assert out.strip().splitlines()[-1].startswith("tg-")
    assert "tiers turbo were not checked" in err
    code, _, err = run(capsys, *create[:-1], "fast", "--config", str(config))
    assert code == 0
    assert "not checked" not in err


@pytest.mark.parametrize("days", ["1e308", "inf", "nan", "3651", "0"])
def test_expiry_beyond_ten_years_is_refused(
    days: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--expires-in must be above 0 and at most 3650 days: exit 2, a clear message, no key."""
    path = tmp_path / "keys.yaml"
    code, out, err = run(
        capsys, "create", "--keys-file", str(path), "--tenant", "t", "--expires-in", days
    )
    assert code == 2
    assert "at most 3650" in err
    assert "tg-" not in out
    assert not path.exists()


def test_list_shows_damaged_records_instead_of_crashing(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stored garbage (an infinite expiry, bytes, a list) is listed as damaged; exit 0."""
    code, _, _ = run(capsys, "create", "--redis-url", redis_server.url, "--tenant", "ok")
    assert code == 0

    async def corrupt() -> None:
        client = Redis.from_url(redis_server.url)
        try:
            record = {
                "id": "forever",
                "tenant": "t",
                "digest": "sha256:00",
                "policy": {"expires_at": 1e308 * 10},
            }
            for key_id, raw in (
                ("forever", json.dumps(record)),
                ("bytes", b"\xfe\xff"),
                ("alist", "[]"),
            ):
                await client.set(f"tiergate:key:{key_id}", raw)
                await client.sadd("tiergate:keys", key_id)
        finally:
            await client.aclose()

    asyncio.run(corrupt())
    code, text, err = run(capsys, "list", "--redis-url", redis_server.url)
    assert code == 0, err
    rows = {line.split()[0]: line for line in text.splitlines()}
    assert len(rows) == 4
    for key_id in ("forever", "bytes", "alist"):
        assert " damaged " in rows[key_id]
    assert "expires_at" in rows["forever"]
    code, raw, _ = run(capsys, "list", "--redis-url", redis_server.url, "--json")
    assert code == 0
    statuses = sorted(item["status"] for item in json.loads(raw))
    assert statuses == ["active", "damaged", "damaged", "damaged"]


def test_list_survives_a_far_future_expiry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finite expiry beyond year 9999 (written by hand) is listed, not a crash."""
    path = tmp_path / "keys.yaml"
    run(capsys, "create", "--keys-file", str(path), "--tenant", "t", "--expires-in", "30")
    text = path.read_text()
    path.write_text(re.sub(r"expires_at: [0-9.e+]+", "expires_at: 1.0e+300", text))
    code, out, err = run(capsys, "list", "--keys-file", str(path))
    assert code == 0, err
    assert "expires=1e+300" in out


def test_redis_store_via_url(redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    """--redis-url stores the key where every replica reads it."""
    code, out, _ = run(
        capsys, "create", "--redis-url", redis_server.url, "--tenant", "t", "--tpm", "100"
    )
    key = out.strip().splitlines()[-1]
    assert code == 0

    async def lookup() -> bool:
        client = Redis.from_url(redis_server.url)
        try:
            record = await RedisKeyStore(client).get(key.split("-")[1])
        finally:
            await client.aclose()
        return record is not None and record.matches(key, None)

    assert asyncio.run(lookup())


def test_unreachable_redis_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A Redis that does not answer gives exit code 2 and a message, not a traceback."""
    code, _, err = run(capsys, "list", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2
    assert "unavailable" in err


def test_console_script_dispatches_keys(tmp_path: Path) -> None:
    """`python -m gateway keys create` works and prints the key last."""
    path = tmp_path / "keys.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "keys",
            "create",
            "--keys-file",
            str(path),
            "--tenant",
            "demo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip().splitlines()[-1].startswith("tg-")


def test_create_help_names_every_scope_and_explains_expires_in(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`keys create --help` lists every scope a key may get, and says what --expires-in does."""
    with pytest.raises(SystemExit):
        main(["create", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for scope in sorted(KNOWN_SCOPES):
        assert scope in text
    assert re.search(r"--expires-in DAYS \S", text)


def test_a_config_with_a_redis_password_file_reaches_a_password_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config` with redis.password_file (the shipped deployments' Redis) authenticates."""
    secret = tmp_path / "redis-password"
    secret.write_text("cli-redis-password-0123456789\n", encoding="utf-8")
    with RedisServer() as server:

        async def require_password() -> None:
            client = Redis.from_url(server.url)
            try:
                await client.config_set("requirepass", "cli-redis-password-0123456789")
            finally:
                await client.aclose()

        asyncio.run(require_password())
        config = tmp_path / "tiergate.yaml"
        redis = f"redis: {{url: '{server.url}', password_file: '{secret}'}}\n"
        config.write_text("auth: {store: redis}\n" + redis, encoding="utf-8")
        code, out, err = run(capsys, "create", "--config", str(config), "--tenant", "t")
        assert code == 0, err
        assert out.strip().splitlines()[-1].startswith("tg-")
        code, _, err = run(capsys, "list", "--redis-url", server.url)
        assert code == 2  # the same Redis, without the password
        assert "cli-redis-password" not in err
