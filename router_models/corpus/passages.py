"""Generated passages (reviews, emails, news, notes, bios, stories) of varied length.

Both labels reuse these texts: a passage followed by "positive or negative?" is simple, the
same passage followed by "return a JSON object with ..." is complex.  So the passage itself
never tells the label; the request around it does.
"""

from __future__ import annotations

from random import Random

from router_models.corpus.lexicon import (
    ADJECTIVES,
    BUSINESSES,
    CITIES,
    HOBBIES,
    JOBS,
    MONTHS,
    NAMES,
    PRODUCTS,
    WEEKDAYS,
    one,
    some,
)

# fmt: off
_POSITIVE = (
    "I've been using the {p} for {n} weeks now and it's honestly {good}.",
    "Setup took five minutes and it just works.",
    "Battery life is way better than I expected.",
    "The staff were friendly and the whole thing felt really well thought out.",
    "Would buy again without thinking twice.",
    "My partner stole it from me, which says it all.",
    "Great value for the price, no complaints at all.",
    "It arrived a day early and the packaging was neat.",
    "Customer service answered my question within an hour.",
    "Feels solid, looks nice on the desk, does exactly what it says.",
    "Ten out of ten, my kids love it.",
    "Honestly the best purchase I made this year.",
    "The food came out hot and the portions were generous.",
    "Clean rooms, quiet street, and the breakfast was lovely.",
)
_NEGATIVE = (
    "The {p} stopped working after {n} days, which is {bad}.",
    "Support kept me on hold for forty minutes and then hung up.",
    "It looks nothing like the photos.",
    "The app crashes every time I try to log in.",
    "Way too loud, I can't use it when the baby is asleep.",
    "Returned it. Not worth half the price.",
    "The strap snapped the second time I wore it.",
    "Our table was ready an hour late and nobody apologised.",
    "The room smelled of smoke and the wifi never worked.",
    "Instructions were useless and two screws were missing.",
    "Charging takes forever and it gets really hot.",
    "I wanted to like it but it's just {bad}.",
    "The delivery guy left it in the rain and the box was soaked.",
)
_NEUTRAL = (
    "It's fine I guess, does the job.",
    "Nothing special but nothing wrong with it either.",
    "The color is a bit different from the picture.",
    "Shipping was average, about a week.",
    "It's smaller than I thought it would be.",
    "I haven't tried all the features yet.",
    "My old one was similar, maybe slightly heavier.",
)
_NEWS_OPENERS = (
    "{city} — Officials announced on {day} that the city will spend {money} on {thing}.",
    "Shares of a {biz} chain rose {pct} percent on {day} after quarterly results beat forecasts.",
    "{name} scored twice as {city} won {a}-{b} in front of a sold-out crowd on {day}.",
    "Researchers in {city} say a new battery design could cut charging times by {pct} percent.",
    "Heavy rain is expected across the region from {day}, with up to {n} centimetres in places.",
    "The council in {city} voted {a} to {b} to approve a new bike lane network.",
    "A local {job} from {city} has been named volunteer of the year.",
    "A startup based in {city} raised {money} to expand its {biz} business.",
    "The national team coach named {n} new players in the squad for next month's qualifiers.",
    "Prices for {thing} climbed again in {month}, according to figures released on {day}.",
)
_NEWS_FOLLOWUPS = (
    "The decision follows months of public debate.",
    "Critics say the plan does not go far enough.",
    "A spokesperson said more details would be published next week.",
    "Analysts had expected a smaller increase.",
    "Residents have been asked to avoid unnecessary travel.",
    "It is the club's third win in a row.",
    "The project is due to finish by {month} next year.",
    "Several opposition members walked out before the vote.",
    "The company plans to hire {n} more people by the end of the year.",
    "The findings were published in a peer-reviewed journal on {day}.",
    "Local businesses welcomed the news.",
    "Some experts warned that the results may not hold at larger scale.",
)
_FILM_POSITIVE = (
    "The film takes its time, but the last half hour is gripping from start to finish.",
    "The lead actor carries every scene with a quiet, lived-in performance.",
    "I laughed more than I have at any comedy in years.",
    "The soundtrack is gorgeous and the city has never looked better on screen.",
    "It is the rare sequel that improves on the original.",
    "By the end half the cinema was in tears, me included.",
    "The dialogue is sharp and the twists actually make sense on a second viewing.",
    "A warm, clever novel that I finished in one sitting.",
)
_FILM_NEGATIVE = (
    "The plot makes no sense and the ending feels like they ran out of money.",
    "Two and a half hours of people explaining things to each other.",
    "The jokes land maybe once every twenty minutes.",
    "The special effects look cheap and the villain is a cardboard cutout.",
    "I checked my phone more often than I watched the screen.",
    "The book drags badly in the middle and the characters never feel real.",
    "Great trailer, shame about the film.",
    "Whoever edited this needs a holiday; scenes just stop mid-sentence.",
)
_THINGS = (
    "road repairs", "new playgrounds", "flood defences", "school meals", "electric buses",
    "housing", "a new library", "street lighting", "rental flats", "train tickets", "fuel",
)
# fmt: on


def _fill(rng: Random, template: str) -> str:
    return template.format(
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
    if mood == "positive":
        pool = list(_POSITIVE) + list(_NEUTRAL[:2])
    elif mood == "negative":
        pool = list(_NEGATIVE) + list(_NEUTRAL[:2])
    else:
        pool = list(_POSITIVE[:5]) + list(_NEGATIVE[:5]) + list(_NEUTRAL)
    sentences = [_fill(rng, t) for t in some(rng, pool, size)]
    return " ".join(sentences), mood


def film_review(rng: Random) -> tuple[str, str]:
    """A film or book review of one to three paragraphs and its sentiment."""
    mood = one(rng, ("positive", "negative"))
    pool = _FILM_POSITIVE if mood == "positive" else _FILM_NEGATIVE
    other = _FILM_NEGATIVE if mood == "positive" else _FILM_POSITIVE
    paragraphs = []
    for _ in range(rng.randint(1, 3)):
        sentences = some(rng, pool, rng.randint(2, 4))
        if rng.random() < 0.3:
            sentences.insert(rng.randrange(len(sentences) + 1), one(rng, other))
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs), mood


def news(rng: Random) -> str:
    """A short news item of one to six sentences."""
    follow = [_fill(rng, t) for t in some(rng, _NEWS_FOLLOWUPS, rng.randint(0, 5))]
    return " ".join([_fill(rng, one(rng, _NEWS_OPENERS)), *follow])


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
    )
    return makers[rng.randrange(len(makers))]()
