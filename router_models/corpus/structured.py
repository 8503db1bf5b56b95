"""Complex prompts: strict structured output (JSON, and a few YAML/XML/CSV)."""

from __future__ import annotations

import json
from random import Random
from typing import Any

from router_models.corpus import passages
from router_models.corpus.lexicon import NAMES, PRODUCTS, one, phrases, some

# fmt: off
_KEY_SETS = (
    ("name", "date", "city"), ("sender", "recipient", "phone"), ("sentiment", "score", "reasons"),
    ("title", "summary", "tags"), ("product", "price", "rating", "pros", "cons"),
    ("people", "places", "organizations"), ("topic", "entities", "urgency"),
    ("action_items", "owners", "deadlines"), ("category", "confidence"),
    ("question", "answer", "sources"), ("invoice_number", "amount", "due_date"),
)
_TOPICS = ("the solar system", "world capitals", "python basics", "the human body", "music")
# fmt: on


def _schema(keys: tuple[str, ...]) -> str:
    props = {k: {"type": "string"} for k in keys}
    return json.dumps({"type": "object", "properties": props, "required": list(keys)})


def _csv(rng: Random) -> str:
    rows = ["name,team,score,joined"]
    for name in some(rng, NAMES, rng.randint(3, 6)):
        team = one(rng, ("red", "blue", "green"))
        joined = f"20{rng.randint(10, 24)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"
        rows.append(f"{name},{team},{rng.randint(10, 99)},{joined}")
    return "\n".join(rows)


def json_extract(rng: Random) -> str:
    """Extract named fields from a passage into strict JSON."""
    keys = one(rng, _KEY_SETS)
    shown = one(rng, (", ".join(keys), json.dumps(list(keys)), " / ".join(keys)))
    text = passages.any_passage(rng)
    if rng.random() < 0.15:
        text = passages.long_document(rng, text)
    ask = one(rng, phrases("json_asks"))
    return ask.format(keys=shown, p=text, schema=_schema(keys))


def json_generate(rng: Random) -> str:
    """Generate a structured document from scratch or from tabular input."""
    return one(rng, phrases("json_generate")).format(
        n=rng.randint(3, 12), topic=one(rng, _TOPICS), csv=_csv(rng)
    )


def json_chat(rng: Random) -> dict[str, Any]:
    """A chat request whose system prompt or ``response_format`` demands JSON."""
    keys = one(rng, _KEY_SETS)
    system = one(rng, phrases("json_system")).format(schema=_schema(keys), keys=", ".join(keys))
    user = one(
        rng,
        (
            passages.email(rng)[0],
            passages.review(rng)[0],
            f"{one(rng, NAMES)} bought a {one(rng, PRODUCTS)} yesterday for "
            f"{rng.randint(9, 900)} dollars and wants to return it",
            passages.notes(rng),
            f"classify this ticket: {passages.message(rng)}",
            passages.message(rng),
        ),
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    body: dict[str, Any] = {"messages": messages}
    if rng.random() < 0.6:
        body["response_format"] = {"type": "json_object"}
    return body
