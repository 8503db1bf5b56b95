# ruff: noqa: RUF001 - the corpus's Chinese text uses full-width commas
"""Attack findings on router_models/corpus/arithmetic.py: ``_slots`` promises "shares divide
exactly, differences and change stay positive"; the templates that subtract or share slots
it did not constrain broke that, and the corpus held such rows. Written by an attack review
against the first version of v8 (which failed them); they hold since the slots were redrawn."""

from __future__ import annotations

import re
from collections.abc import Callable
from random import Random

from router_models.corpus import arithmetic
from router_models.corpus.build import DEFAULT_CORPUS
from router_models.corpus.lexicon import FOODS, NAMES
from router_models.records import read_jsonl


def _broken(slots: dict[str, object]) -> list[str]:
    s = {k: v for k, v in slots.items() if isinstance(v, int)}
    broken = []
    if s["big"] <= s["n1"]:  # arith_one_en: "A tank holds {big} litres and {n1} ... used"
        broken.append("tank: litres left <= 0")
    if s["paid"] % s["k"]:  # arith_one_en: "paid ${paid} for {k} identical tickets"
        broken.append("tickets: price not a whole number of cents")
    if s["total"] <= s["n2"]:  # arith_multi_*: width = length {total} - {n2}
        broken.append("rectangle: width <= 0")
    if s["p"] <= s["q"]:  # arith_multi_*: football = basketball {p} - {q}
        broken.append("football: price <= 0")
    if s["h"] * (s["d1"] + s["d2"]) > s["d1"] * s["d2"]:  # arith_multi_*: 1 - h/d1 - h/d2
        broken.append("joint work: remaining share < 0")
    return broken


def test_slots_keep_differences_positive_and_shares_exact() -> None:
    """400 draws (about 190 break one of the five templates)."""
    rng = Random(0)
    bad = [b for _ in range(400) for b in _broken(arithmetic._slots(rng, NAMES, ("mug",), FOODS))]
    assert not bad, sorted({b: bad.count(b) for b in bad}.items())


def _last_user(record: dict[str, object]) -> str:
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages = record["messages"]
    assert isinstance(messages, list)
    return str([m["content"] for m in messages if m["role"] == "user"][-1])


PATTERNS: dict[
    str, tuple[str, Callable[[list[int]], bool]]
] = {  # (regex, broken(groups)) over the shipped corpus's word problems
    "rectangle": (
        r"长是(\d+)厘米，宽比长短(\d+)|縦の長さは(\d+)cmで、横の長さは縦より(\d+)cm",
        lambda g: g[0] <= g[1],
    ),
    "football": (
        r"篮球每个(\d+)元，足球每个比篮球便宜(\d+)元|1個(\d+)円で、サッカーボールはそれより1個(\d+)円",
        lambda g: g[0] <= g[1],
    ),
    "joint work": (
        r"甲队单独做要(\d+)天完成，乙队单独做要(\d+)天完成，两队合做(\d+)天"
        r"|Aさん1人では(\d+)日、Bさん1人では(\d+)日で終えます。2人で(\d+)日",
        lambda g: g[2] * (g[0] + g[1]) > g[0] * g[1],
    ),
    "tickets": (r"paid \$(\d+) for (\d+) identical tickets", lambda g: (100 * g[0]) % g[1] != 0),
}


def test_the_shipped_corpus_has_no_nonsense_word_problems() -> None:
    """The first v8 corpus had 5 rectangles of negative width, 4 footballs of price <= 0, 10
    joint-work problems with a negative remainder, 7 ticket prices like $1000 / 9."""
    found: dict[str, list[str]] = {}
    for record in read_jsonl(DEFAULT_CORPUS):
        if record["category"] != "math_multistep":
            continue
        text = _last_user(record)
        for name, (pattern, broken) in PATTERNS.items():
            match = re.search(pattern, text)
            if match:
                groups = [int(g) for g in match.groups() if g is not None]
                if broken(groups):
                    found.setdefault(name, []).append(text)
    assert not found, {name: (len(rows), rows[0]) for name, rows in found.items()}
