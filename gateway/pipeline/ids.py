"""Request ids: cheap, random, UUID-shaped (backends such as llama.cpp accept only UUIDs)."""

from __future__ import annotations

import random

# A random 128-bit number made a version-4 UUID: version nibble 4, variant bits 10.
_UUID4_CLEAR = ~((0xF << 76) | (0x3 << 62))
_UUID4_SET = (0x4 << 76) | (0x2 << 62)


def fresh_id() -> str:
    """A new request id: a random version-4 UUID in hex (32 digits).

    Ids name requests in logs and on backends; they grant nothing, so the process's
    Mersenne Twister (reseeded in every forked worker) replaces ``uuid4``'s ``os.urandom``
    call (3.7 µs → 0.7 µs here). 122 random bits keep collisions out of
    reach.
    """
    return "%032x" % (random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET)
