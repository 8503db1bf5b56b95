"""Long passages followed by a question, where the question alone sets the label.

A passage of neutral material (or a short argument) followed by a deduction, a
"which must be true / weakens / assumes" choice or a constraint puzzle needs several steps:
complex.  The same kind of passage followed by a look-up question, even in multiple-choice
form, is simple (see also ``simple_text.reading``).  All wording is written here.
"""

from __future__ import annotations

import itertools
from random import Random

from router_models.corpus import passages
from router_models.corpus.lexicon import CITIES, JOBS, NAMES, PRODUCTS, one, some

# fmt: off
_GROUPS = ("engineers", "nurses", "farmers", "students", "cyclists", "shop owners",
           "volunteers", "pilots", "teachers", "musicians", "researchers", "drivers")
_PROPS = (("speak two languages", "speaks two languages"), ("own a car", "owns a car"),
          ("live near the river", "lives near the river"), ("work at night", "works at night"),
          ("play chess", "plays chess"), ("keep a garden", "keeps a garden"),
          ("commute by train", "commutes by train"), ("have a passport", "has a passport"),
          ("read the local paper", "reads the local paper"),
          ("belong to a union", "belongs to a union"))
_EFFECTS = ("sales rose", "complaints fell", "attendance doubled", "costs went up",
            "accidents dropped", "waiting times grew", "the river got cleaner", "rents climbed")
_CAUSES = ("a new bus line opened", "the council cut the budget", "a rival shop closed",
           "the school day started later", "a festival moved to the town",
           "prices were frozen", "the bridge was repaired", "a factory reopened")
_ASKS = (
    "Given the statements, which option has to hold?", "Which option follows from the text?",
    "Which option, if it were true, would undercut the conclusion the most?",
    "Which option, if it were true, would give the conclusion the most support?",
    "What does the argument take for granted without saying so?",
    "What is wrong with the reasoning above?",
    "Assuming every statement above holds, which option is impossible?",
)
_TAILS = ("", "", "Answer with the letter.", "Explain your choice.", "Choose one option.",
          "Think it through before answering.")
_LOOKUPS = ("According to the text, in which city does this take place?",
            "Which product is named in the passage?", "Who is mentioned first in the text?",
            "What is the passage mainly about?", "Which of these words appears in the text?")
_ORDER_ASKS = ("Which of the following could be the order, first to last?",
               "Which order satisfies every condition?", "Which arrangement is possible?")
# fmt: on


def _options(rng: Random, claims: list[str]) -> str:
    glue = one(rng, ("\n", " ", "\n"))
    return glue.join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(claims))


def _claim(rng: Random) -> str:
    name, group, (plural, singular) = one(rng, NAMES), one(rng, _GROUPS), one(rng, _PROPS)
    return one(
        rng,
        (
            f"{name} does not {plural}.",
            f"Some {group} {plural}.",
            f"No {group} {plural}.",
            f"{name} is one of the {group}.",
            f"Everyone in {one(rng, CITIES)} who {singular} is one of the {group}.",
        ),
    )


def _argument(rng: Random) -> str:
    """A short argument: premises linking groups and properties, or a cause and a claim."""
    a, b = some(rng, NAMES, 2)
    g1, g2 = some(rng, _GROUPS, 2)
    (p1, _), (_, s2) = some(rng, _PROPS, 2)
    if rng.random() < 0.5:
        return (
            f"All {g1} in the survey {p1}. Anyone who does that also {s2} or lives alone. "
            f"{a} is one of the {g1}, and {a} does not live alone. {b} {s2} but is not one "
            f"of the {g2}."
        )
    effect, cause = one(rng, _EFFECTS), one(rng, _CAUSES)
    return (
        f"Last year in {one(rng, CITIES)}, {cause}, and within six months {effect}. A local "
        f"{one(rng, JOBS)} concluded that the first change caused the second. Nearby towns "
        f"where nothing similar happened saw no such change, although {a} points out that "
        f"the survey covered only {rng.randint(20, 90)} households."
    )


def argument_choice(rng: Random) -> str:
    """Optional background paragraphs, an argument, a reasoning question, four options."""
    body = _argument(rng)
    if rng.random() < 0.4:
        body = passages.long_document(rng, passages.any_passage(rng)) + "\n\n" + body
    options = _options(rng, [_claim(rng) for _ in range(4)])
    return f"{body}\n\n{one(rng, _ASKS)}\n{options}\n{one(rng, _TAILS)}".strip()


def schedule_puzzle(rng: Random) -> str:
    """Assign people to slots under several conditions, then choose a valid arrangement."""
    people = some(rng, NAMES, rng.randint(4, 6))
    what = one(
        rng,
        (
            "talks on one morning",
            "shifts this week",
            "stalls at the fair",
            "seats in one row",
            "slots on the radio show",
        ),
    )
    rules = [
        f"{people[0]} goes before {people[1]}.",
        f"{people[2]} is not first or last.",
        f"If {people[1]} is third, then {people[3]} is second.",
        f"{people[3]} and {people[0]} are not next to each other.",
    ]
    rng.shuffle(rules)
    orders = [", ".join(rng.sample(people, len(people))) for _ in range(4)]
    lead = f"{len(people)} people, {', '.join(people)}, are given {what}, one each."
    return (
        f"{lead} The following conditions apply. {' '.join(rules)}\n"
        f"{one(rng, _ORDER_ASKS)}\n"
        f"{_options(rng, orders)}"
    )


def passage_deduction(rng: Random) -> str:
    """A long neutral passage, then a question that combines several of its facts."""
    text = passages.long_document(rng, passages.any_passage(rng))
    ask = one(
        rng,
        (
            "Using only the text above, work out which two statements in it cannot both be "
            "true, and explain step by step.",
            "Based on the passage, what can be concluded if the second paragraph is false? "
            "Reason through each part before answering.",
            f"Suppose every {one(rng, PRODUCTS)} mentioned above cost twice as much. Which "
            "conclusions in the text would no longer follow? Justify each one.",
            "Which claim in the passage is best supported by the others, and which rests on "
            "an unstated assumption? Explain the chain of reasoning.",
        ),
    )
    return f"{text}\n\n{ask}"


def passage_lookup_choice(rng: Random) -> str:
    """A long neutral passage, then a look-up question in multiple-choice form (simple)."""
    text = passages.long_document(rng, passages.any_passage(rng))
    options = _options(rng, some(rng, CITIES + NAMES, 4))
    return f"{text}\n\n{one(rng, _LOOKUPS)}\n{options}\n{one(rng, _TAILS[:3])}".strip()


# fmt: off
_TECH_LOOKUPS = ("According to the passage, what is this called?", "What year is mentioned?",
                 "Which number appears in the text?", "What is the topic of the paragraph?",
                 "Name one example given in the text.", "Según el texto, ¿de qué trata?",
                 "Was ist laut Text das Thema?", "О чём этот текст?",
                 "What does the text say happens first?", "Where, according to the text?")
_PLACES = ("library", "bakery", "gym", "post office", "museum", "dentist", "hardware store",
           "swimming pool", "bank", "market")
# fmt: on


def technical_lookup(rng: Random) -> str:
    """A technical reference paragraph (often not English) and a look-up question: simple."""
    text = passages.technical(rng)
    if rng.random() < 0.3:
        text = f"{text}\n\n{passages.encyclopedia(rng)}"
    return (
        f"{text}\n{one(rng, _TECH_LOOKUPS)}"
        if rng.random() < 0.5
        else (f"{one(rng, _TECH_LOOKUPS)}\n\n{text}")
    )


def schedule_gap(rng: Random) -> str:
    """A day's timetable with one free gap; deduce when a visit could have happened."""
    name, place = one(rng, NAMES), one(rng, _PLACES)
    start = rng.randint(6, 9)
    hours = list(range(start, start + rng.randint(5, 8)))
    free = rng.randrange(1, len(hours) - 1)
    lines = [f"{name} got up at {start}:00."]
    lines += [
        f"From {h}:00 to {h + 1}:00 {name} was seen at the {one(rng, _PLACES)}."
        for h in hours
        if h != hours[free]
    ]
    lines.append(f"The {place} shuts at {hours[-1] + 1}:00.")
    rng.shuffle(lines)
    spans = [f"{h}:00-{h + 1}:00" for h in some(rng, hours, 4)]
    ask = one(
        rng,
        (
            f"When could {name} have gone to the {place}?",
            f"In which window was the visit to the {place} possible?",
        ),
    )
    return f"{' '.join(lines)}\n{ask}\n{_options(rng, spans)}"


def ordering_choice(rng: Random) -> str:
    """Items in a fixed row with relative-position clues; choose the true option."""
    things = some(rng, PRODUCTS, rng.randint(3, 6))
    clues = [f"The {a} is to the left of the {b}." for a, b in itertools.pairwise(things)]
    rng.shuffle(clues)
    claims = [f"The {t} is {one(rng, ('first', 'second', 'last', 'third'))}." for t in things[:4]]
    lead = one(rng, ("A shelf holds", "In a shop window stand", "On a table, in a row, are"))
    return (
        f"{lead} {len(things)} items: {', '.join(sorted(things))}. {' '.join(clues)}\n"
        f"{one(rng, ('Which option is correct?', 'Which of these is true?'))}\n"
        f"{_options(rng, claims)}"
    )
