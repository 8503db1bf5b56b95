"""Simple prompts: small talk, short factual questions, light creative and everyday advice."""

from __future__ import annotations

from random import Random

from router_models.corpus.lexicon import (
    ANIMALS,
    BOOKS,
    BUSINESSES,
    CITIES,
    COUNTRIES,
    ELEMENTS,
    EVENTS,
    FEELINGS,
    FOODS,
    HOBBIES,
    INVENTIONS,
    LANDMARKS,
    LANGUAGES,
    MONTHS,
    NAMES,
    PRODUCTS,
    SCIENCE_TERMS,
    SPORTS,
    WEEKDAYS,
    one,
    phrases,
    some,
)

# fmt: off
_FAV = ("movie", "book", "season", "animal", "number", "word", "song", "holiday", "snack")
_PAIRS = (("tea", "coffee"), ("cats", "dogs"), ("summer", "winter"), ("pizza", "burgers"),
          ("beach", "mountains"), ("mornings", "nights"), ("books", "movies"))
_FACT_LEADS = ("Quick question: ", "Do you know ", "Can you tell me ", "I was wondering, ",
               "hey, ", "Q: ", "trivia: ", "settle a bet - ", "random question but ")
_CREATIVE = (
    "write a haiku about {topic}", "a short poem about my {animal} please",
    "give me 5 names for a {animal}", "suggest a name for my {biz}",
    "write a funny caption for a photo of my {animal}", "come up with a slogan for a {biz}",
    "write a one-line birthday wish for {name}", "give me a cute nickname for {name}",
    "write a tweet announcing that our {biz} is open on {day}s now",
    "three rhyming words for {word}", "a limerick about {hobby}, keep it short",
    "write a two-sentence horror story", "make up a riddle for kids",
    "write a short thank-you note to my neighbour for watering my plants",
    "give me a fun fact about {animal}s", "suggest a team name for our {sport} club",
    "write an instagram caption for a trip to {city}", "short motivational quote please",
    "compose a 4-line poem for my mom's birthday", "a toast for my friend's wedding, 3 lines",
    "Write a short email to my landlord asking when the heating will be fixed.",
    "write a quick text to {name} saying i'll be 10 minutes late",
    "Write a two-line product description for a {product}.",
    "draft a polite out-of-office reply", "Write a short story about a {animal} in {city}.",
    "write a kids' bedtime story about a brave {animal}, very short",
    "Write a LinkedIn post announcing my new job as a {job}, 3 sentences.",
    "give me a pick-up line about {hobby} lol", "Write a thank you card for my teacher.",
)
_ADVICE = (
    "how do i boil an egg", "how long should i steep green tea", "best way to fall asleep faster?",
    "what should i cook tonight with {food}", "tips for staying focused while studying",
    "how do i get rid of hiccups", "how often should i water a cactus",
    "what's a good gift for a {hobby} fan", "recommend a book like {book}",
    "any tips for a first trip to {city}?", "how do i get a stain out of a white shirt",
    "what should i wear to a job interview", "how can i be more productive in the morning",
    "give me 3 ideas for a rainy {day}", "what are some easy {hobby} tips for beginners",
    "what's a good movie for a family night", "how do i keep my {animal} cool in summer",
    "how long do i microwave popcorn", "what's an easy breakfast idea",
    "how do i clean my keyboard", "should i bring a jacket to {city} in spring",
    "what are good snacks for a road trip", "how do i tell my boss i need a day off",
    "how much water should i drink a day", "how do i make my plants grow faster",
    "what can i do when i'm bored at home", "suggest a podcast about {hobby}",
    "is it ok to leave my {product} charging overnight", "how do i unclog a sink",
    "what's the best time to visit {country}", "how do i remove a wine stain from carpet",
    "what temperature should i wash towels at", "how do i say no to a friend politely",
    "should i get a {animal} or a {animal2}", "what do i need for a picnic",
)
_COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "silver", "pink")
_THINGS = ("fruit", "color", "animal", "country", "movie genre", "number", "card", "emoji")
_RECORDS = ("hot dog eating contest", "tongue", "fingernails", "kiss", "wedding dress")
# fmt: on


def _values(rng: Random) -> dict[str, object]:
    """Every slot the simple-talk templates may use."""
    a, b = one(rng, _PAIRS)
    city, city2 = some(rng, CITIES, 2)
    animal, animal2 = some(rng, ANIMALS, 2)
    product, product2 = some(rng, PRODUCTS, 2)
    names = some(rng, NAMES, 3)
    return {
        "feeling": one(rng, FEELINGS),
        "hobby": one(rng, HOBBIES),
        "city": city,
        "city2": city2,
        "animal": animal,
        "animal2": animal2,
        "sport": one(rng, SPORTS),
        "day": one(rng, WEEKDAYS),
        "name": names[0],
        "thing": one(rng, _FAV),
        "a": a,
        "b": b,
        "c": names[2],
        "food": one(rng, FOODS),
        "country": one(rng, COUNTRIES),
        "book": one(rng, BOOKS),
        "landmark": one(rng, LANDMARKS),
        "invention": one(rng, INVENTIONS),
        "event": one(rng, EVENTS),
        "term": one(rng, SCIENCE_TERMS),
        "element": one(rng, ELEMENTS),
        "language": one(rng, LANGUAGES),
        "month": one(rng, MONTHS),
        "product": product,
        "product2": product2,
        "show": one(rng, phrases("shows")),
        "song": one(rng, phrases("songs")),
        "n": rng.randint(2, 9),
        "m": rng.randint(2, 60),
        "k": rng.randint(3, 99),
        "year": rng.randint(1960, 2024),
        "biz": one(rng, BUSINESSES),
        "job": one(rng, ("nurse", "teacher", "data analyst", "chef")),
        "topic": one(rng, ("autumn", "the sea", "coffee", "mondays", "the moon", "snow", "cats")),
        "word": one(rng, phrases("words")),
        "plural": one(rng, phrases("plurals")),
        "color": one(rng, _COLORS),
        "sentence": one(rng, phrases("short_phrases")),
        "thing2": one(rng, _RECORDS),
    }


def chitchat(rng: Random) -> str:
    """Small talk: a canned line or a filled small-talk template."""
    if rng.random() < 0.55:
        return one(rng, phrases("chitchat"))
    values = _values(rng)
    values["thing"] = one(rng, _FAV)
    return one(rng, phrases("chat_templates")).format(**values)


def factual_qa(rng: Random) -> str:
    """A short factual question, often typed like a search query."""
    roll = rng.random()
    if roll < 0.25:
        question = one(rng, phrases("facts"))
    elif roll < 0.45:
        question = one(rng, phrases("search_queries")).format(**_values(rng))
    else:
        question = one(rng, phrases("fact_templates")).format(**_values(rng))
    style = rng.random()
    if style < 0.45:
        return question
    if style < 0.75:
        return question[0].upper() + question[1:] + "?"
    return one(rng, _FACT_LEADS) + question + one(rng, ("?", "", "??", " thanks"))


def general_instruction(rng: Random) -> str:
    """A one-step instruction: name, list, define, convert, describe briefly."""
    values = _values(rng)
    values["thing"] = one(rng, _THINGS)
    return one(rng, phrases("instructions_simple")).format(**values)


def true_false(rng: Random) -> str:
    """Verify an everyday factual statement."""
    return one(rng, phrases("true_false_asks")).format(s=one(rng, phrases("statements")))


def short_creative(rng: Random) -> str:
    """A light creative request whose answer is a few lines."""
    return one(rng, _CREATIVE).format(**_values(rng))


def advice(rng: Random) -> str:
    """An everyday how-to or recommendation question with a short answer."""
    return one(rng, _ADVICE).format(**_values(rng))


# fmt: off
_FACT_SHAPES = (
    "name the capital of {country}", "Tell me who wrote {book}.", "{element} atomic number",
    "the year {event} happened", "Population of {country}, roughly.", "I need the author of {book}",
    "{landmark} - where is it", "Give me the currency used in {country}.",
    "What's {term}? one line", "who invented {invention}", "height of {landmark}",
    "Which country is {city} in", "meaning of the word {word}",
    "official language of {country}", "State the chemical symbol for {element}.",
    "I forgot which ocean borders {country}", "the inventor of {invention}, please",
    "Tell me when {event} was.", "fact check: {city} is in {country}", "define {term}",
    "Is {city} the capital of {country}", "Remind me who the author of {book} is.",
    "capital city of {country}", "{book} - who's the author", "How many people live in {city}",
    "List the colours of the flag of {country}.", "Boiling point of water in Fahrenheit.",
)
# fmt: on


def factual_plain(rng: Random) -> str:
    """A short factual look-up phrased as a command, a fragment or a question."""
    return one(rng, _FACT_SHAPES).format(**_values(rng))
