"""Simple prompts over a given text: rewrite, classify, extract, translate, summarise briefly.

Many of these are long (a passage of several sentences or a whole document) but easy: the
question is one short decision or a light edit.  They are the "long but easy" hard negatives.
"""

from __future__ import annotations

from collections.abc import Callable
from random import Random

from router_models.corpus import passages
from router_models.corpus.lexicon import CITIES, LANGUAGES, NAMES, one, phrases, some

# fmt: off
_LABEL_SETS = (
    "billing, technical support, sales, other", "sports, politics, business, science, culture",
    "positive, negative, neutral", "urgent, normal, low priority", "question, complaint, praise",
    "spam, not spam", "Music, Sports, Technology, Travel, Food", "joy, anger, sadness, fear",
    "cancel order, track order, change address, refund", "formal, informal",
)
_LIST_TASKS = (
    ("Select the oldest person from the list.", ("Napoleon", "Cleopatra", "Einstein", "Mozart")),
    ("Which of these cities is in Asia?", CITIES),
    ("Pick the word that is a verb.", ("table", "run", "blue", "quickly")),
    ("Which of these is not a fruit?", ("apple", "banana", "carrot", "mango")),
    ("Find the largest number in the list. Output just the number.", ("12", "87", "-3", "45")),
    ("Which name is the shortest?", NAMES),
    ("Choose the animal that can swim.", ("eagle", "camel", "dolphin", "goat")),
)
# fmt: on


def rewrite(rng: Random) -> str:
    """A light edit of one or two sentences."""
    s = one(rng, phrases("sentences"))
    if rng.random() < 0.25:
        s = s + " " + one(rng, phrases("sentences"))
    return one(rng, phrases("rewrite_asks")).format(s=s)


def _arrange(rng: Random, passage: str, question: str) -> str:
    """Put a short question before or after a passage, with varied glue."""
    shape = rng.randrange(6)
    if shape == 0:
        return f"{question}\n\n{passage}"
    if shape == 1:
        return f"{passage}\n\n{question}"
    if shape == 2:
        return f'{question}\n"{passage}"'
    if shape == 3:
        return f"Text: {passage}\nQuestion: {question}"
    if shape == 4:
        return f"{question}\n\nInput: {passage}\nOutput:"
    return f"{passage} {question}"


def _multiple_choice(rng: Random) -> str:
    question, *options = one(rng, phrases("multiple_choice")).split(" | ")
    letters = "ABCD"
    glue = one(rng, ("\n", " ", "\n"))
    shown = glue.join(f"({letters[i]}) {o}" for i, o in enumerate(options))
    tail = one(rng, ("Answer with the letter.", "Select A, B, C, or D.", "", "Which one?"))
    return f"{question}{glue}{shown}{glue}{tail}".strip()


def _label_set(rng: Random) -> str:
    ask = one(rng, phrases("label_sets")).format(labels=one(rng, _LABEL_SETS))
    text = passages.message(rng) if rng.random() < 0.5 else passages.any_passage(rng)
    return _arrange(rng, text, ask)


def _choose_from_list(rng: Random) -> str:
    ask, pool = one(rng, _LIST_TASKS)
    return f"{ask}\n\n{', '.join(some(rng, pool, 4))}"


def _numbered_sentences(rng: Random) -> str:
    sentences = some(rng, phrases("sentences"), rng.randint(3, 5))
    listed = " ".join(f"({i + 1}) {s}" for i, s in enumerate(sentences))
    ask = one(
        rng,
        (
            "Which sentence is the most formal? Output the index.",
            "Which sentence mentions time? Give the number.",
            "Select the longest sentence, output the sentence index.",
        ),
    )
    return f"{ask}\n\n{listed}"


def _reviewed(rng: Random) -> str:
    text = (passages.review(rng) if rng.random() < 0.6 else passages.film_review(rng))[0]
    return passages.long_document(rng, text) if rng.random() < 0.1 else text


def classification(rng: Random) -> str:
    """A one-label decision about a (possibly long) passage or a short list."""
    kinds: tuple[Callable[[], str], ...] = (
        lambda: _arrange(rng, _reviewed(rng), one(rng, phrases("sentiment_q"))),
        lambda: _arrange(rng, passages.news(rng), one(rng, phrases("topic_q"))),
        lambda: _arrange(rng, passages.message(rng), one(rng, phrases("message_q"))),
        lambda: _arrange(rng, passages.any_passage(rng), one(rng, phrases("generic_q"))),
        lambda: _multiple_choice(rng),
        lambda: _label_set(rng),
        lambda: _choose_from_list(rng),
        lambda: _numbered_sentences(rng),
    )
    weights = (3, 2, 2, 2, 1, 2, 1, 1)
    return rng.choices(kinds, weights=weights)[0]()


def extraction(rng: Random) -> str:
    """Pull one plain fact (not a structured document) out of a passage."""
    question, _, kind = one(rng, phrases("extract_q")).partition(" | ")
    source = {
        "email": lambda: passages.email(rng)[0],
        "story": lambda: passages.story(rng),
        "bio": lambda: passages.bio(rng),
        "notes": lambda: passages.notes(rng),
        "review": lambda: passages.review(rng)[0],
        "news": lambda: passages.news(rng),
    }[kind]()
    if rng.random() < 0.25:
        source = passages.long_document(rng, source)
    return _arrange(rng, source, question)


def reading(rng: Random) -> str:
    """A question answered by looking something up in a given context (closed QA)."""
    maker = one(
        rng,
        (
            passages.encyclopedia,
            passages.document,
            passages.news,
            passages.bio,
            passages.specs,
            passages.specs,
        ),
    )
    context = maker(rng)
    if rng.random() < 0.2:
        context = passages.long_document(rng, context)
    question = one(rng, phrases("reading_q"))
    shape = rng.randrange(3)
    if shape == 0:
        return f"Context: {context}\nQuestion: {question}"
    if shape == 1:
        return f"{context}\n\n{question}"
    return f"Read this and answer: {question}\n\n{context}"


def translation(rng: Random) -> str:
    """Translate a short phrase or sentence."""
    pool = "short_phrases" if rng.random() < 0.6 else "sentences"
    text = one(rng, phrases(pool))
    if rng.random() < 0.15:
        text = f"{one(rng, NAMES)} says: {text}"
    return one(rng, phrases("translate_asks")).format(lang=one(rng, LANGUAGES), s=text)


def summarize_short(rng: Random) -> str:
    """A one-line summary of a passage or a longer document."""
    text = passages.any_passage(rng)
    if rng.random() < 0.3:
        text = passages.long_document(rng, text)
    return one(rng, phrases("summary_asks")).format(p=text)
