"""Generated passages (reviews, emails, news, notes, bios, stories) of varied length.

Both labels reuse these texts: a passage followed by "positive or negative?" is simple, the
same passage followed by "return a JSON object with ..." is complex.  So the passage itself
never tells the label; the request around it does.
"""

from __future__ import annotations

from random import Random

from router_models.corpus.lexicon import (
    ADJECTIVES,
    ANIMALS,
    BUSINESSES,
    CITIES,
    HOBBIES,
    JOBS,
    MONTHS,
    NAMES,
    PRODUCTS,
    WEEKDAYS,
    one,
    phrases,
    some,
)

# fmt: off
_REGIONS = ("northern Europe", "the Andes", "West Africa", "south-east Asia", "the Balkans",
            "central Canada", "the Scottish Highlands", "eastern Australia", "Patagonia")
_SURNAMES = ("Okafor", "Lindqvist", "Tanaka", "Moreau", "Silva", "Novak", "Haddad", "Kowalski")
_STRUCTURES = ("clock tower", "harbour bridge", "opera house", "lighthouse", "railway station")
_GAMES = ("game of Draughtsmen", "game of Kallo", "game of Stones and Rivers", "game of Fenn")
_RIVERS = ("Avel", "Morra", "Sill", "Tarn", "Oswin", "Brenna")
_FESTIVALS = ("Lantern Festival", "Harbour Jazz Week", "Spring Kite Fair", "Folk Days")
_CENTURIES = ("twelfth", "fourteenth", "sixteenth", "eighteenth", "nineteenth")
_THINGS = (
    "road repairs", "new playgrounds", "flood defences", "school meals", "electric buses",
    "housing", "a new library", "street lighting", "rental flats", "train tickets", "fuel",
)
# fmt: on


def _fill(rng: Random, template: str) -> str:
    year = rng.randint(1850, 1990)
    return template.format(
        region=one(rng, _REGIONS),
        century=one(rng, _CENTURIES),
        thing2=one(rng, _STRUCTURES),
        surname=one(rng, _SURNAMES),
        year=year,
        year2=year + rng.randint(2, 15),
        year3=year + rng.randint(20, 40),
        game=one(rng, _GAMES),
        river=one(rng, _RIVERS),
        festival=one(rng, _FESTIVALS),
        city2=one(rng, CITIES),
        animal=one(rng, ANIMALS),
        color=one(rng, ("red", "blue", "silver", "green", "rose gold")),
        p=one(rng, PRODUCTS),
        n=rng.randint(2, 12),
        good=one(rng, ("great", "excellent", "fantastic", "really good", "a joy")),
        bad=one(rng, ("annoying", "ridiculous", "a shame", "unacceptable", "disappointing")),
        city=one(rng, CITIES),
        day=one(rng, WEEKDAYS),
        money=f"${rng.randint(2, 90)} million",
        thing=one(rng, _THINGS),
        biz=one(rng, BUSINESSES),
        pct=rng.randint(3, 40),
        name=one(rng, NAMES),
        a=rng.randint(1, 9),
        b=rng.randint(0, 5),
        job=one(rng, JOBS),
        month=one(rng, MONTHS),
    )


def review(rng: Random, sentiment: str | None = None) -> tuple[str, str]:
    """A product, hotel or restaurant review of 1-8 sentences and its sentiment."""
    mood = sentiment or one(rng, ("positive", "negative", "positive", "negative", "mixed"))
    size = rng.choice((1, 1, 2, 3, 4, 5, 6, 8))
    positive, negative = phrases("review_positive"), phrases("review_negative")
    neutral = phrases("review_neutral")
    if mood == "positive":
        pool = [*positive, *some(rng, neutral, 2)]
    elif mood == "negative":
        pool = [*negative, *some(rng, neutral, 2)]
    else:
        pool = [*some(rng, positive, 6), *some(rng, negative, 6), *neutral]
    sentences = [_fill(rng, t) for t in some(rng, pool, size)]
    return " ".join(sentences), mood


def film_review(rng: Random) -> tuple[str, str]:
    """A film or book review of one to three paragraphs and its sentiment."""
    mood = one(rng, ("positive", "negative"))
    good, bad = phrases("film_positive"), phrases("film_negative")
    pool, other = (good, bad) if mood == "positive" else (bad, good)
    paragraphs = []
    for _ in range(rng.randint(1, 3)):
        sentences = some(rng, pool, rng.randint(2, 4))
        if rng.random() < 0.3:
            sentences.insert(rng.randrange(len(sentences) + 1), one(rng, other))
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs), mood


def news(rng: Random) -> str:
    """A short news item of one to six sentences."""
    follow = [_fill(rng, t) for t in some(rng, phrases("news_followups"), rng.randint(0, 5))]
    return " ".join([_fill(rng, one(rng, phrases("news_openers"))), *follow])


def encyclopedia(rng: Random) -> str:
    """A reference-style paragraph (animal, place, building, person, process)."""
    return _fill(rng, one(rng, phrases("encyclopedia")))


def technical(rng: Random) -> str:
    """A technical reference paragraph (science, computing, engineering), some not English."""
    return _fill(rng, one(rng, phrases("technical")))


def specs(rng: Random) -> str:
    """A number-heavy description: specs, results, timetables, reports."""
    return _fill(rng, one(rng, phrases("specs")))


def document(rng: Random) -> str:
    """A practical document: recipe, policy, instructions, notice, job advert."""
    return _fill(rng, one(rng, phrases("documents")))


def email(rng: Random) -> tuple[str, dict[str, str]]:
    """A work or personal email with extractable details, and those details."""
    sender, to = some(rng, NAMES, 2)
    day, month = one(rng, WEEKDAYS), one(rng, MONTHS)
    date = f"{month} {rng.randint(1, 28)}"
    time = f"{rng.randint(8, 17)}:{one(rng, ('00', '15', '30', '45'))}"
    phone = f"{rng.randint(200, 989)}-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    city = one(rng, CITIES)
    order = f"{one(rng, ('A', 'B', 'K', 'TX', 'ORD-'))}{rng.randint(10000, 99999)}"
    body = one(
        rng,
        (
            f"Hi {to},\n\nJust confirming our meeting on {day}, {date} at {time} at the {city} "
            f"office. If anything changes you can reach me on {phone}.\n\nThanks,\n{sender}",
            f"Hello {to}, your order {order} has shipped and should arrive by {date}. "
            f"Questions? Call us at {phone}. - The {one(rng, BUSINESSES)} team",
            f"Dear {to},\nI'm writing to ask whether the {one(rng, PRODUCTS)} I returned on "
            f"{date} has been refunded. The reference is {order}. I live in {city} and can be "
            f"reached at {phone}.\nKind regards,\n{sender}",
            f"hey {to.lower()}! party at mine {day} from {time}, bring snacks. address is 14 "
            f"{one(rng, ('Elm', 'Harbour', 'Mill', 'Station'))} Road, {city}. text me on {phone}"
            f" if you get lost :) {sender}",
            f"{to}, the invoice {order} for {rng.randint(120, 9800)} dollars is overdue since "
            f"{date}. Please settle it or contact {sender} in accounts ({phone}).",
        ),
    )
    details = {"sender": sender, "recipient": to, "date": date, "phone": phone, "city": city}
    return body, details


def bio(rng: Random) -> str:
    """A short biography paragraph."""
    name = f"{one(rng, NAMES)} {one(rng, ('Okafor', 'Lindqvist', 'Tanaka', 'Moreau', 'Silva'))}"
    year = rng.randint(1940, 1999)
    parts = [
        f"{name} was born in {one(rng, CITIES)} in {year}.",
        f"After studying to be a {one(rng, JOBS)}, {name.split(maxsplit=1)[0]} moved to "
        f"{one(rng, CITIES)} in {year + rng.randint(18, 30)}.",
        f"In their spare time they enjoy {one(rng, HOBBIES)} and {one(rng, HOBBIES)}.",
        f"They founded a small {one(rng, BUSINESSES)} that now employs {rng.randint(3, 80)} "
        "people.",
        f"They have written {rng.randint(2, 9)} books and won a regional prize in "
        f"{year + rng.randint(25, 45)}.",
    ]
    return " ".join(parts[: rng.randint(2, 5)])


def notes(rng: Random) -> str:
    """Meeting notes as a short bulleted list."""
    items = [
        f"- {one(rng, NAMES)} to send the {one(rng, ('budget', 'slides', 'draft', 'report'))}"
        f" by {one(rng, WEEKDAYS)}",
        f"- launch moved to {one(rng, MONTHS)} {rng.randint(1, 28)}",
        f"- {one(rng, ('hiring', 'marketing', 'support', 'design'))} needs "
        f"{rng.randint(1, 4)} more people",
        f"- customers complained the {one(rng, PRODUCTS)} is {one(rng, ADJECTIVES)}",
        f"- next sync {one(rng, WEEKDAYS)} at {rng.randint(9, 16)}:00",
        f"- {one(rng, NAMES)} is out of office until {one(rng, MONTHS)}",
    ]
    return "\n".join(some(rng, items, rng.randint(2, 6)))


def story(rng: Random) -> str:
    """A small everyday story of two to seven sentences."""
    name, friend = some(rng, NAMES, 2)
    lines = [
        f"{name} woke up late on {one(rng, WEEKDAYS)} and missed the bus to {one(rng, CITIES)}.",
        f"On the way, {name} bumped into {friend}, an old friend from school.",
        f"They decided to grab coffee at a tiny {one(rng, BUSINESSES)} near the station.",
        f"{friend} talked for an hour about {one(rng, HOBBIES)}.",
        "By the time they left it had started to rain, and neither had an umbrella.",
        f"{name} finally got home, soaked but smiling.",
        f"That evening {name} signed up for a {one(rng, HOBBIES)} class.",
    ]
    start = rng.randint(0, 2)
    return " ".join(lines[start : start + rng.randint(2, 6)])


def message(rng: Random) -> str:
    """A short text message, tweet or customer-support message."""
    return _fill(
        rng,
        one(
            rng,
            (
                "my {p} won't turn on since this morning, can someone help??",
                "Just got back from {city} and I'm already missing it",
                "WIN a free {p}!!! click the link and enter your card details now",
                "can i change my delivery address for order {n}{a}{b}",
                "cancel my subscription please, I've been charged twice",
                "Loving the new update, the dark mode looks {good}",
                "what time do you close on {day}?",
                "Congratulations! You've been selected for a {money} prize, reply YES",
                "is the {biz} on {city} road open today",
                "ugh {day} again. need coffee",
                "I was charged for a {p} I never ordered. Who do I talk to?",
                "Thanks for the quick reply yesterday, problem solved!",
                "Your account will be suspended unless you verify your password here",
                "Do you ship to {city}?",
            ),
        ),
    )


def long_document(rng: Random, first: str) -> str:
    """``first`` followed by two to four more passages: a long, mixed document."""
    parts = [first, *(any_passage(rng) for _ in range(rng.randint(2, 4)))]
    return "\n\n".join(parts)


def any_passage(rng: Random) -> str:
    """A passage of any kind."""
    makers = (
        lambda: review(rng)[0],
        lambda: news(rng),
        lambda: email(rng)[0],
        lambda: bio(rng),
        lambda: notes(rng),
        lambda: story(rng),
        lambda: film_review(rng)[0],
        lambda: encyclopedia(rng),
        lambda: document(rng),
        lambda: specs(rng),
        lambda: specs(rng),
    )
    return makers[rng.randrange(len(makers))]()
