"""``tiergate keys create|list|revoke|rotate``: manage API keys in a key file or in Redis.

The store comes from ``--keys-file`` or ``--redis-url``, else from the settings
(``--config``/environment: ``auth.store``, ``auth.keys_file``, ``redis.url``). ``create`` and
``rotate`` print the new key once, as the last line of stdout; nothing else ever prints a key
or a digest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from gateway.access.keystore_file import FileKeyStore
from gateway.access.keystore_redis import RedisKeyStore
from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings, Settings, load_settings
from policies.keys import (
    KeyStore,
    KeyStoreUnavailable,
    check_owner,
    create_key,
    describe,
    make_policy,
    revoke_key,
    rotate_stored_key,
)

_Command = Callable[[argparse.Namespace, KeyStore, Settings], Awaitable[int]]


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _pepper(settings: Settings) -> bytes | None:
    pepper = settings.auth.pepper
    return pepper.encode("utf-8") if pepper else None


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    try:
        return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%MZ")
    except (OverflowError, ValueError, OSError):  # beyond what datetime can show
        return f"{epoch:g}"


async def _create(args: argparse.Namespace, store: KeyStore, settings: Settings) -> int:
    now = time.time()
    check_owner(args.tenant, args.name)
    policy = make_policy(
        tiers=args.tiers,
        rpm=args.rpm,
        tpm=args.tpm,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        expires_in_days=args.expires_in,
        scopes=args.scope,
        budget_daily=args.budget_daily,
        budget_monthly=args.budget_monthly,
        max_n=args.max_n,
        rules=args.rule,
        max_precise_share=args.max_precise_share,
        precise_share_over=args.precise_share_over,
        priority=args.priority,
        queue_weight=args.queue_weight,
        now=now,
        known_tiers=tuple(settings.tiers) if args.config is not None else None,
    )
    record, key = await create_key(
        store, args.tenant, policy, now=now, name=args.name, pepper=_pepper(settings)
    )
    print(
        f"created key {record.key_id} for tenant {record.tenant!r} "
        f"(expires {_when(policy.expires_at)}); it is shown once, store it now:"
    )
    print(key)
    if args.tiers and args.config is None:
        print(
            f"note: tiers {','.join(args.tiers)} were not checked against a gateway "
            "configuration (give --config to check them); a key naming only tiers the gateway "
            "does not have may use none",
            file=sys.stderr,
        )
    return 0


def _row(item: dict[str, Any]) -> str:
    if item["status"] == "damaged":
        return f"{item['id']:<12} damaged  {item['error']}"
    policy = item["policy"]
    tiers = ",".join(policy["tiers"]) if policy["tiers"] else "all"
    limits = " ".join(
        f"{name}={policy[name] if policy[name] is not None else '-'}"
        for name in ("rpm", "tpm", "max_tokens", "concurrency")
    )
    scopes = ",".join(policy["scopes"]) or "-"
    return (
        f"{item['id']:<12} {item['status']:<8} {item['tenant']:<16} {item['name'] or '-':<16}"
        f" tiers={tiers} {limits} scopes={scopes} expires={_when(policy['expires_at'])}"
    )


async def _list(args: argparse.Namespace, store: KeyStore, settings: Settings) -> int:
    now = time.time()
    items = [describe(r, now) for r in await store.all()]
    items += [entry.describe() for entry in await store.damaged()]
    if args.json:
        print(json.dumps(items, indent=2, allow_nan=False))
    elif not items:
        print("no keys")
    else:
        for item in items:
            print(_row(item))
    return 0


def _applies(store: KeyStore) -> str:
    """When a change reaches running gateways, truthfully for each store."""
    if isinstance(store, FileKeyStore):
        return (
            "gateways reading this file apply it within their auth.keys_reload_interval_s "
            "(1 s by default)"
        )
    return "every gateway on this Redis applies it at once"


async def _revoke(args: argparse.Namespace, store: KeyStore, settings: Settings) -> int:
    record = await revoke_key(store, args.key_id)
    if record is None:
        print(f"tiergate keys: no key has id {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked key {record.key_id} (tenant {record.tenant!r}); {_applies(store)}")
    return 0


async def _rotate(args: argparse.Namespace, store: KeyStore, settings: Settings) -> int:
    result = await rotate_stored_key(store, args.key_id, _pepper(settings))
    if result is None:
        print(f"tiergate keys: no key has id {args.key_id!r}", file=sys.stderr)
        return 1
    record, key = result
    print(
        f"rotated key {record.key_id}: the old key stops working and the new one works; "
        f"{_applies(store)}. New key, shown once:"
    )
    print(key)
    return 0


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="gateway YAML settings")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--keys-file", type=Path, default=None, help="YAML key file")
    where.add_argument("--redis-url", default=None, help="Redis URL of the shared key store")


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    """The key's owner, tiers and limits: rates, caps, expiry and compute budgets."""
    parser.add_argument("--tenant", required=True, help="owner label (safe to log)")
    parser.add_argument("--name", default="", help="free-form label")
    parser.add_argument("--tiers", type=_csv, default=None, help="allowed tiers, e.g. fast")
    parser.add_argument("--rpm", type=int, default=None, help="requests per minute")
    parser.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    parser.add_argument("--max-tokens", type=int, default=None, help="max_tokens cap")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight")
    parser.add_argument(
        "--max-n",
        type=int,
        default=None,
        help="completions per request (n, best_of, prompts); default 1",
    )
    parser.add_argument(
        "--expires-in",
        type=float,
        default=None,
        metavar="DAYS",
        help="the key stops working DAYS days from now (fractions allowed); default never",
    )
    parser.add_argument(
        "--budget-daily", type=float, default=None, help="compute budget in cost units per UTC day"
    )
    parser.add_argument(
        "--budget-monthly",
        type=float,
        default=None,
        help="compute budget in cost units per calendar month",
    )


def _add_routing_options(parser: argparse.ArgumentParser) -> None:
    """The key's routing: its precise-share cap, extra scopes and rule overrides."""
    parser.add_argument(
        "--max-precise-share",
        type=float,
        default=None,
        metavar="SHARE",
        help="the most of the key's recent requests that may go to the precise tier (0-1)",
    )
    parser.add_argument(
        "--precise-share-over",
        choices=("downgrade", "refuse"),
        default=None,
        help="over the cap: serve on the fast tier (default) or refuse with 429",
    )
    parser.add_argument(
        "--scope",
        action="append",
        default=[],
        help="extra scope: route_override, downgrade, engine_fields, priority (repeatable)",
    )
    parser.add_argument(
        "--priority",
        choices=("interactive", "batch"),
        default=None,
        help="the key's class in a full tier's queue: interactive (default) before batch",
    )
    parser.add_argument(
        "--queue-weight",
        type=float,
        default=None,
        metavar="WEIGHT",
        help="its weight among the tenants waiting in its class (default 1)",
    )
    parser.add_argument(
        "--rule",
        action="append",
        default=[],
        help="override a routing rule for this key: json_schema|json_object|tools|long_prompt"
        ":on|off (repeatable), e.g. --rule json_object:on",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``tiergate keys`` parser."""
    parser = argparse.ArgumentParser(
        prog="tiergate keys",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="create a key and print it once")
    _add_store_options(create)
    _add_limit_options(create)
    _add_routing_options(create)
    create.set_defaults(run=_create)
    listing = sub.add_parser("list", help="list keys (never secrets or digests)")
    _add_store_options(listing)
    listing.add_argument("--json", action="store_true", help="JSON output")
    listing.set_defaults(run=_list)
    for name, run, text in (
        ("revoke", _revoke, "disable a key for good"),
        ("rotate", _rotate, "new secret, same id and policy"),
    ):
        action = sub.add_parser(name, help=text)
        _add_store_options(action)
        action.add_argument("key_id")
        action.set_defaults(run=run)
    return parser


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    client: Redis | None = None
    store: KeyStore
    if args.keys_file is not None:
        store = FileKeyStore(args.keys_file)
    elif args.redis_url is not None or settings.auth.store == "redis":
        try:
            redis = RedisSettings(
                url=args.redis_url or settings.redis.url,
                password_file=None if args.redis_url else settings.redis.password_file,
                key_prefix=settings.redis.key_prefix,
                socket_timeout_s=5.0,
            )
        except ValidationError as exc:  # pydantic's text quotes the URL, and its password
            raise ValueError(f"--redis-url: {exc.errors()[0]['msg']}") from None
        client = open_redis(redis)
        store = RedisKeyStore(client, redis.key_prefix)
    elif settings.auth.keys_file is not None:
        store = FileKeyStore(settings.auth.keys_file)
    else:
        raise ValueError(
            "say where keys live: --keys-file PATH, --redis-url URL, or a --config "
            "with auth.keys_file / auth.store: redis"
        )
    command: _Command = args.run
    try:
        return await command(args, store, settings)
    finally:
        if client is not None:
            await client.aclose()


def main(argv: list[str] | None = None) -> int:
    """Run ``tiergate keys``."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
        return asyncio.run(_run(args, settings))
    except (ValueError, KeyStoreUnavailable) as exc:
        print(f"tiergate keys: {exc}", file=sys.stderr)
        return 2
