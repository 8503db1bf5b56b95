"""Compose the labelled router corpus from the template modules with a seeded RNG.

Run ``python -m router_models.corpus.build [--out PATH] [--seed N]``; the default output is the
committed ``tiergate-corpus.jsonl`` and the same seed always writes the same bytes.

Each line: ``{"id", "source", "category", "label", "prompt" | "messages", ...request fields}``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from random import Random
from typing import Any, Final

from router_models.corpus import (
    arithmetic,
    code_tasks,
    dressing,
    math_problems,
    multilingual,
    passage_logic,
    reasoning,
    reasoning_tasks,
    simple_talk,
    simple_text,
    structured,
)

CORPUS_DIR: Final = Path(__file__).parent
DEFAULT_CORPUS: Final = CORPUS_DIR / "tiergate-corpus.jsonl"
HARD_CASES: Final = CORPUS_DIR / "hard-cases.jsonl"
DEFAULT_SEED: Final = 20250301
SOURCE: Final = "tiergate-gen"

TextGen = Callable[[Random], str]


@dataclass(frozen=True)
class Recipe:
    """How many prompts of one category to draw, from which generators."""

    category: str
    label: str
    count: int
    generators: tuple[TextGen, ...]
    noise: bool = True


RECIPES: Final = (
    Recipe("chitchat", "simple", 520, (simple_talk.chitchat,)),
    Recipe(
        "factual_qa",
        "simple",
        680,
        (
            simple_talk.factual_qa,
            simple_talk.factual_qa,
            simple_talk.factual_qa,
            simple_talk.factual_qa,
            simple_talk.factual_qa,
            simple_talk.true_false,
        ),
    ),
    Recipe("general_instruction", "simple", 260, (simple_talk.general_instruction,)),
    Recipe("short_creative", "simple", 200, (simple_talk.short_creative,)),
    Recipe("advice", "simple", 200, (simple_talk.advice,)),
    Recipe("rewrite", "simple", 330, (simple_text.rewrite,)),
    Recipe("classification", "simple", 560, (simple_text.classification,)),
    Recipe(
        "extraction",
        "simple",
        460,
        (simple_text.extraction, simple_text.extraction, simple_text.reading),
    ),
    Recipe("translation", "simple", 220, (simple_text.translation,)),
    Recipe("summarize_short", "simple", 340, (simple_text.summarize_short,)),
    Recipe(
        "math_multistep",
        "complex",
        660,
        (
            math_problems.word_problem,
            math_problems.word_problem,
            math_problems.symbolic,
            math_problems.short_math,
        ),
    ),
    Recipe(
        "code",
        "complex",
        560,
        (
            code_tasks.write_function,
            code_tasks.write_function,
            code_tasks.write_component,
            code_tasks.debug,
            code_tasks.explain_or_refactor,
            code_tasks.snippet_question,
        ),
    ),
    Recipe("code", "complex", 220, (code_tasks.stub, code_tasks.problem_statement), noise=False),
    Recipe(
        "reasoning",
        "complex",
        420,
        (reasoning.puzzle, reasoning.puzzle, reasoning.fermi, reasoning.causal),
    ),
    Recipe(
        "reasoning",
        "complex",
        200,
        (
            reasoning_tasks.date_arithmetic,
            reasoning_tasks.boolean_expression,
            reasoning_tasks.navigation,
            reasoning_tasks.swaps,
            reasoning_tasks.web_of_lies,
            reasoning_tasks.object_counting,
            reasoning_tasks.ordering,
        ),
    ),
    Recipe("json_output", "complex", 340, (structured.json_extract, structured.json_generate)),
    Recipe("long_analysis", "complex", 360, (reasoning.essay,)),
    Recipe(
        "passage_logic",
        "complex",
        220,
        (
            passage_logic.argument_choice,
            passage_logic.argument_choice,
            passage_logic.passage_deduction,
        ),
    ),
    Recipe("passage_logic", "simple", 130, (passage_logic.passage_lookup_choice,)),
    Recipe(
        "choice_puzzles",
        "complex",
        180,
        (passage_logic.schedule_puzzle, passage_logic.schedule_gap, passage_logic.ordering_choice),
    ),
    Recipe("choice_puzzles", "simple", 130, (passage_logic.technical_lookup,)),
    Recipe("multilingual", "complex", 300, (multilingual.code_request,)),
    Recipe("multilingual", "simple", 160, (multilingual.simple_short,)),
    Recipe("factual_qa", "simple", 200, (simple_talk.factual_plain,)),
)
HISTORY_POOL: Final = (
    simple_talk.chitchat,
    simple_talk.factual_qa,
    simple_text.rewrite,
    code_tasks.write_function,
    math_problems.word_problem,
    reasoning.essay,
    simple_talk.advice,
    simple_text.translation,
)
# Word problems by their number of operations (router rounds 16 and 16b, docs/router.md):
# one-step problems (simple) in English, Chinese and Japanese, and Chinese and Japanese problems
# of three or more steps (complex), in the family of the English multi-step problems so that a
# fold leaves every word problem out together. They come from a Random of their own and are
# appended after the shuffle, so the rows built before them are unchanged.
ARITHMETIC_SEED_OFFSET: Final = 1601  # round 16b's seed 1 (docs/router.md)
ARITHMETIC: Final = tuple(
    Recipe("math_multistep", label, count,
           (partial(arithmetic.problem, language=lang, steps=steps),), noise=lang == "en")
    for label, count, lang, steps in (
        ("simple", 200, "en", "one"),
        ("simple", 120, "zh", "one"),
        ("simple", 120, "ja", "one"),
        ("complex", 100, "zh", "multi"),
        ("complex", 100, "ja", "multi"),
    )
)  # fmt: skip
JSON_CHATS: Final = 120
FOLLOWUPS: Final = 150


def _wrap(rng: Random, text: str, complex_label: bool) -> dict[str, Any]:
    """Turn a user prompt into a completion or chat record, with label-neutral extras."""
    record: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.45:
        record["prompt"] = text
    elif roll < 0.75:
        record["messages"] = [{"role": "user", "content": text}]
    else:
        turns = [g(rng) for g in rng.sample(HISTORY_POOL, rng.choice((0, 1, 1, 2)))]
        record["messages"] = dressing.as_chat(rng, text, turns)
    record.update(dressing.request_fields(rng, complex_label))
    return record


def _recipe_records(rng: Random, recipe: Recipe, seen: set[str]) -> Iterator[dict[str, Any]]:
    made, tries = 0, 0
    while made < recipe.count and tries < recipe.count * 20:
        tries += 1
        text = recipe.generators[rng.randrange(len(recipe.generators))](rng)
        if recipe.noise:
            text = dressing.noisy(rng, text)
        if text in seen:
            continue
        seen.add(text)
        made += 1
        record = _wrap(rng, text, recipe.label == "complex")
        yield {"category": recipe.category, "label": recipe.label, **record}


def _json_chats(rng: Random) -> Iterator[dict[str, Any]]:
    for _ in range(JSON_CHATS):
        yield {"category": "json_output", "label": "complex", **structured.json_chat(rng)}


def _followups(rng: Random) -> Iterator[dict[str, Any]]:
    """Short last turns whose label depends on what they ask, after a real first turn."""
    openers = {
        "code": code_tasks.write_function,
        "math_multistep": math_problems.word_problem,
        "reasoning": reasoning.puzzle,
        "json_output": structured.json_extract,
        "long_analysis": reasoning.essay,
    }
    for i in range(FOLLOWUPS * 2):
        complex_label = i % 2 == 0
        category, text = dressing.followup(rng, complex_label)
        opener = openers.get(category) or HISTORY_POOL[rng.randrange(len(HISTORY_POOL))]
        messages = dressing.as_chat(rng, dressing.noisy(rng, text), [opener(rng)])
        label = "complex" if complex_label else "simple"
        yield {"category": category, "label": label, "messages": messages}


def build(seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """All corpus records, in a fixed order, with ids."""
    rng = Random(seed)  # noqa: S311 - reproducible corpus, not security
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    for recipe in RECIPES:
        records.extend(_recipe_records(rng, recipe, seen))
    records.extend(_json_chats(rng))
    records.extend(_followups(rng))
    rng.shuffle(records)
    arithmetic_rng = Random(seed + ARITHMETIC_SEED_OFFSET)  # noqa: S311 - as above
    arithmetic_seen: set[str] = set()
    for recipe in ARITHMETIC:
        records.extend(_recipe_records(arithmetic_rng, recipe, arithmetic_seen))
    return [{"id": f"gen-{i:05d}", "source": SOURCE, **record} for i, record in enumerate(records)]


def write(records: list[dict[str, Any]], path: Path) -> None:
    """Write ``records`` as JSONL (UTF-8, one compact object per line)."""
    lines = (json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in records)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: regenerate the corpus file."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    records = build(args.seed)
    write(records, args.out)
    print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
