"""Caller-supplied values that look like credentials, kept out of logs (issue 34).

A caller can put anything in a field the gateway logs (``model``, ``x-request-id``): an admin
token pasted by mistake, or someone else's API key. ``looks_like_secret`` says whether a value
has a credential's shape; the logging side replaces such a value with ``[REDACTED]``.

A value looks like a credential when it holds a TierGate API key (``tg-<id>-<secret>``), a
``Bearer``/``Basic`` credential, a run of more than 32 hex digits, or a run of 20 or more
characters of a token alphabet (letters, digits, ``-``, ``_``, ``+``, ``=``) with a piece of 12
or more characters between separators that mixes upper case, lower case and digits: at least
99 % of ``secrets.token_urlsafe(32)`` outputs (tests/policies/test_redaction.py), while model
names such as ``DeepSeek-R1-Distill-Qwen-32B`` are short words between dashes and are kept.
A 32-digit hex run is a UUID's shape as well as a 128-bit hex token's: it is kept, so request
ids stay readable (a hex token of exactly 32 digits is not caught). The gateway's own admin
token is also scrubbed by value from every log line (``gateway.telemetry.logging``).

Pure standard library: this module is part of the policy core.
"""

from __future__ import annotations

import re
from typing import Final

REDACTED: Final = "[REDACTED]"
_KEY_OR_SCHEME: Final = re.compile(
    r"tg-[a-z0-9]+-[A-Za-z0-9_\-]{16,}|\b(?:[Bb]earer|[Bb]asic)\s+\S"
)
_TOKEN_RUN: Final = re.compile(r"[A-Za-z0-9_\-+=]{20,}")
_HEX_RUN: Final = re.compile(r"[0-9a-fA-F]{33,}")
_UPPER: Final = re.compile(r"[A-Z]")
_LOWER: Final = re.compile(r"[a-z]")
_DIGIT: Final = re.compile(r"[0-9]")
_SEPARATORS: Final = re.compile(r"[-_+=]")
MIN_SEGMENT: Final = 12


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` holds something shaped like a credential (see the module doc)."""
    if _KEY_OR_SCHEME.search(value) or _HEX_RUN.search(value):
        return True
    for run in _TOKEN_RUN.findall(value):
        for part in _SEPARATORS.split(run):
            if len(part) >= MIN_SEGMENT and _mixed(part):
                return True
    return False


def _mixed(part: str) -> bool:
    return bool(_DIGIT.search(part)) and bool(_UPPER.search(part)) and bool(_LOWER.search(part))


def redacted(value: str) -> str:
    """``value``, or ``[REDACTED]`` when it looks like a credential."""
    return REDACTED if looks_like_secret(value) else value
