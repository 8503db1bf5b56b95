"""``tiergate router dial SHARE [--tenant T]``: turn the cost dial of a running gateway.

It calls ``PUT /admin/router/share`` on one gateway with the admin token; that gateway shares
the change with its other workers and, through Redis, with every replica
(``gateway/routing/dial_sync.py``).
``SHARE`` is a number in [0, 1], or ``clear`` to drop a tenant's own target (or a dialled
default: back to ``router.target_precise_share``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import httpx

TOKEN_ENV = "TIERGATE_ADMIN_TOKEN"  # noqa: S105  # the variable's name, not a token


def _share(text: str) -> float | None:
    if text == "clear":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a share: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share is within [0, 1], got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiergate router dial", description=__doc__)
    parser.add_argument("share", type=_share, help="target precise share in [0, 1], or 'clear'")
    parser.add_argument("--tenant", default=None, help="this tenant's own target (default: all)")
    parser.add_argument(
        "--url", default="http://127.0.0.1:8080", help="a gateway's base URL (default %(default)s)"
    )
    parser.add_argument(
        "--admin-token-file",
        type=Path,
        default=None,
        help=f"file holding the admin token (default: ${TOKEN_ENV})",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    return parser


def _token(args: argparse.Namespace) -> str | None:
    path: Path | None = args.admin_token_file
    if path is not None:
        return path.read_text(encoding="utf-8").strip()
    token = os.environ.get(TOKEN_ENV)
    return token or None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Send the change; print the targets now in force (exit 1 on a refusal)."""
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    token = _token(args)
    if not token:
        print(
            f"tiergate: the admin token is needed (--admin-token-file or ${TOKEN_ENV})",
            file=sys.stderr,
        )
        return 2
    body = {"share": args.share, "tenant": args.tenant}
    try:
        response = httpx.put(
            args.url.rstrip("/") + "/admin/router/share",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=args.timeout,
        )
    except httpx.HTTPError as exc:
        print(f"tiergate: {args.url} did not answer: {type(exc).__name__}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        print(f"tiergate: refused ({response.status_code}): {message}", file=sys.stderr)
        return 1
    data = response.json()
    who = f"tenant {args.tenant!r}" if args.tenant else "the fleet default"
    what = "cleared" if args.share is None else f"set to {args.share:g}"
    print(f"dial for {who} {what}; version {data['version']}", file=out)
    print(json.dumps(data, sort_keys=True), file=out)
    return 0
