"""Word banks shared by the corpus templates, plus two tiny picking helpers."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from random import Random
from typing import Final, TypeVar

T = TypeVar("T")
PHRASES_DIR: Final = Path(__file__).parent / "phrases"


@functools.cache
def phrases(name: str) -> tuple[str, ...]:
    """Lines of ``phrases/<name>.txt``, without blanks and ``#`` comments; ``\\n`` = newline."""
    text = (PHRASES_DIR / f"{name}.txt").read_text(encoding="utf-8")
    lines = (line.rstrip() for line in text.splitlines())
    return tuple(line.replace("\\n", "\n") for line in lines if line and not line.startswith("#"))


def one(rng: Random, options: Sequence[T]) -> T:
    """One element of ``options``."""
    return options[rng.randrange(len(options))]


def some(rng: Random, options: Sequence[T], k: int) -> list[T]:
    """``k`` distinct elements of ``options`` in random order."""
    return rng.sample(list(options), min(k, len(options)))


# fmt: off
NAMES: Final = (
    "Maya", "Tom", "Priya", "Diego", "Aisha", "Lukas", "Mei", "Kwame", "Sofia", "Jonah",
    "Fatima", "Oliver", "Hana", "Mateo", "Zara", "Ravi", "Elena", "Sam", "Noor", "Felix",
    "Grace", "Tariq", "Ingrid", "Kenji", "Lucia", "Omar", "Chloe", "Nikhil", "Amara", "Ben",
    "Yusuf", "Clara", "Dmitri", "Leila", "Marcus", "Ana", "Theo", "Rosa", "Ibrahim", "Julia",
    "Pedro", "Nadia", "Finn", "Sunita", "Carlos", "Wen", "Abby", "Jamal", "Olga", "Reza",
)

CITIES: Final = (
    "Lisbon", "Nairobi", "Osaka", "Toronto", "Lyon", "Denver", "Bangalore", "Krakow",
    "Melbourne", "Bogota", "Glasgow", "Seoul", "Austin", "Porto", "Accra", "Hamburg",
    "Manila", "Quito", "Tallinn", "Leeds", "Cebu", "Perth", "Valencia", "Dublin",
)

COUNTRIES: Final = (
    "Portugal", "Kenya", "Japan", "Canada", "France", "Peru", "India", "Poland", "Australia",
    "Colombia", "Scotland", "South Korea", "Ghana", "Germany", "the Philippines", "Ecuador",
    "Estonia", "Norway", "Vietnam", "Morocco", "Chile", "Egypt", "Finland", "Mexico",
    "Indonesia", "Turkey", "Argentina", "New Zealand", "Nigeria", "Thailand", "Greece",
)

LANGUAGES: Final = (
    "French", "Spanish", "German", "Italian", "Portuguese", "Japanese", "Korean", "Dutch",
    "Polish", "Swedish", "Turkish", "Hindi", "Arabic", "Mandarin", "Indonesian", "Greek",
)

PROG_LANGS: Final = (
    "Python", "Python", "Python", "JavaScript", "TypeScript", "Java", "C++", "C#", "Go",
    "Rust", "Kotlin", "Ruby", "PHP", "Swift", "Scala", "C",
)

FOODS: Final = (
    "apples", "cupcakes", "muffins", "oranges", "cookies", "eggs", "pencils", "stickers",
    "marbles", "tomatoes", "bagels", "candles", "notebooks", "plants", "shirts", "tickets",
    "books", "bottles of juice", "bags of rice", "jars of jam", "loaves of bread", "pies",
)

ANIMALS: Final = (
    "cat", "dog", "parrot", "hamster", "goldfish", "rabbit", "turtle", "horse", "owl",
    "octopus", "penguin", "giraffe", "hedgehog", "fox", "otter", "bee",
)

HOBBIES: Final = (
    "gardening", "running", "baking", "chess", "painting", "hiking", "photography",
    "knitting", "cycling", "rock climbing", "video games", "yoga", "fishing", "pottery",
    "board games", "skateboarding", "birdwatching", "surfing", "guitar", "cooking",
)

TOPICS: Final = (
    "climate change", "remote work", "social media", "renewable energy", "urban planning",
    "artificial intelligence", "public transport", "the gig economy", "space exploration",
    "online education", "universal basic income", "nuclear power", "fast fashion",
    "electric cars", "video game violence", "school uniforms", "cryptocurrency",
    "genetic engineering", "the four-day work week", "tourism", "water scarcity",
    "misinformation", "aging populations", "privacy", "automation", "local journalism",
)

PRODUCTS: Final = (
    "wireless earbuds", "coffee maker", "running shoes", "laptop", "blender", "backpack",
    "phone case", "desk lamp", "air fryer", "electric toothbrush", "yoga mat", "smartwatch",
    "vacuum cleaner", "office chair", "water bottle", "bluetooth speaker", "rice cooker",
    "winter jacket", "kindle", "mechanical keyboard", "hair dryer", "tent",
)

BUSINESSES: Final = (
    "bakery", "bike repair shop", "dog grooming salon", "coffee truck", "bookshop",
    "yoga studio", "food delivery startup", "plant nursery", "tutoring service",
    "craft brewery", "co-working space", "vintage clothing store", "mobile app studio",
    "cleaning company", "pottery studio", "escape room", "meal-prep service",
)

ADJECTIVES: Final = (
    "amazing", "terrible", "okay", "fantastic", "disappointing", "solid", "flimsy", "great",
    "awful", "decent", "excellent", "mediocre", "lovely", "overpriced", "reliable",
)

SCIENCE_TERMS: Final = (
    "photosynthesis", "osmosis", "an atom", "DNA", "a black hole", "gravity", "a virus",
    "inflation", "a neuron", "plate tectonics", "entropy", "a vaccine", "the ozone layer",
    "a supernova", "evolution", "a calorie", "a molecule", "an enzyme", "a volcano",
    "a tsunami", "democracy", "GDP", "a carbon footprint", "an algorithm", "a hurricane",
)

BOOKS: Final = (
    "Pride and Prejudice", "One Hundred Years of Solitude", "The Hobbit", "Moby Dick",
    "Things Fall Apart", "The Great Gatsby", "War and Peace", "Don Quixote", "Beloved",
    "The Catcher in the Rye", "Frankenstein", "Jane Eyre", "Brave New World", "Dracula",
    "The Little Prince", "Crime and Punishment", "Wuthering Heights", "Les Miserables",
    "The Kite Runner", "Norwegian Wood", "Little Women", "Anna Karenina", "Dune",
)

LANDMARKS: Final = (
    "the Eiffel Tower", "Machu Picchu", "the Taj Mahal", "the Great Barrier Reef",
    "Mount Kilimanjaro", "the Colosseum", "Angkor Wat", "Stonehenge", "the Golden Gate Bridge",
    "Petra", "the Sagrada Familia", "Table Mountain", "the Acropolis", "Uluru", "Niagara Falls",
    "the Alhambra", "Chichen Itza", "Mount Fuji", "the Louvre", "the Burj Khalifa",
)

INVENTIONS: Final = (
    "the telephone", "the light bulb", "the printing press", "penicillin", "the radio",
    "the World Wide Web", "the steam engine", "the airplane", "dynamite", "the microwave oven",
    "the bicycle", "the television", "the thermometer", "the zipper", "the vaccine for polio",
    "the periodic table", "the telescope", "the ballpoint pen", "the sewing machine",
)

SPORTS: Final = (
    "soccer", "basketball", "volleyball", "rugby", "baseball", "cricket", "ice hockey",
    "water polo", "handball", "netball", "american football", "field hockey",
)

EVENTS: Final = (
    "the first moon landing", "the fall of the Berlin Wall", "World War I",
    "the French Revolution", "the Great Depression", "the first modern Olympics",
    "the Chernobyl disaster", "the invention of the internet", "the Renaissance",
    "the sinking of the Titanic", "the end of apartheid", "the Cuban missile crisis",
    "the American Civil War", "the Black Death", "the signing of the Magna Carta",
)

ELEMENTS: Final = (
    "gold", "iron", "sodium", "potassium", "silver", "lead", "mercury", "tin", "helium",
    "carbon", "oxygen", "copper", "zinc", "neon", "calcium", "uranium",
)

FEELINGS: Final = (
    "tired", "bored", "happy", "stressed", "excited", "lonely", "nervous", "sleepy",
    "grumpy", "great", "meh", "anxious", "hungry", "sad", "so good", "a bit down",
)

WEEKDAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

MONTHS: Final = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)

JOBS: Final = (
    "nurse", "teacher", "software engineer", "plumber", "accountant", "chef", "pilot",
    "electrician", "graphic designer", "pharmacist", "lawyer", "farmer", "barista",
    "data analyst", "firefighter", "librarian", "architect", "dentist",
)
# fmt: on
