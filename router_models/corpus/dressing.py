"""Label-neutral dressing: tone, typos, system prompts, chat history and request fields.

Every function here is applied with the same probabilities to simple and complex prompts, so
none of it can leak the label.  Only the follow-up turns carry their own label, because there
the last message's meaning depends on the conversation.
"""

from __future__ import annotations

from random import Random
from typing import Any

from router_models.corpus.lexicon import BUSINESSES, NAMES, PROG_LANGS, one, phrases

# fmt: off
_COMPLEX_FOLLOWUPS = (
    ("code", "now add error handling and unit tests"), ("code", "can you make it run in O(n)?"),
    ("code", "what if the input list is empty or has duplicates? update the code"),
    ("code", "convert that to {lang} and keep the same complexity"),
    ("code", "it fails on the second test case, can you debug it?"),
    ("code", "refactor it into a class with proper type hints"),
    ("code", "make it async and handle timeouts"),
    ("code", "that's O(n^2), can you do better? explain the new approach"),
    ("math_multistep", "are you sure? redo the calculation step by step"),
    ("math_multistep", "now what if the rate is compounded monthly instead?"),
    ("math_multistep", "ok and how many would be left after three more weeks? show the working"),
    ("math_multistep", "what if the price goes up 12% first and then they get the discount?"),
    ("reasoning", "why? walk me through the logic again, I don't follow step 2"),
    ("reasoning", "what if one of them was lying? does the answer change?"),
    ("reasoning", "ok now suppose there are five people instead of three, solve it again"),
    ("json_output", "now return the same thing as strict JSON with an extra field 'confidence'"),
    ("json_output", "put all of that into a JSON array, one object per item, no prose"),
    ("long_analysis", "expand that into a full report with sections and citations"),
    ("long_analysis", "now write the counterargument in the same depth"),
)
_SIMPLE_FOLLOWUPS = (
    ("chitchat", "thanks, that works!"), ("chitchat", "perfect, thank you"), ("chitchat", "lol ok"),
    ("chitchat", "cool"), ("chitchat", "great, you're a lifesaver"), ("chitchat", "never mind"),
    ("factual_qa", "ok unrelated, what's the capital of Canada?"),
    ("rewrite", "can you make that sound a bit friendlier?"),
    ("summarize_short", "shorter please, one sentence"), ("translation", "and in Spanish?"),
    ("chitchat", "got it, have a nice day"), ("factual_qa", "who wrote that book again?"),
    ("chitchat", "haha nice"), ("chitchat", "ok that makes sense"),
    ("factual_qa", "btw what year is it in your training data?"),
    ("rewrite", "remove the last sentence"), ("chitchat", "you're the best"),
)
_TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search_docs", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}},
)
_SIZES = (64, 128, 256, 512, 1024, 2048, 4096)
# fmt: on


def _typo(rng: Random, word: str) -> str:
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if kind == 1:
        return word[:i] + word[i + 1 :]
    return word[:i] + word[i] + word[i:]


def noisy(rng: Random, text: str) -> str:
    """Casual tone: maybe a greeting or sign-off, lowercase, missing punctuation, typos."""
    if rng.random() < 0.2:
        text = one(rng, phrases("prefixes")) + " " + text[0].lower() + text[1:]
    if rng.random() < 0.12:
        text = text + one(rng, phrases("suffixes"))
    if rng.random() < 0.12:
        text = text.lower()
    if rng.random() < 0.1 and text[-1:] in ".?!":
        text = text[:-1]
    if rng.random() < 0.12:
        words = text.split(" ")
        spots = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
        for i in rng.sample(spots, min(len(spots), rng.randint(1, 2))):
            words[i] = _typo(rng, words[i])
        text = " ".join(words)
    return text


def system_prompt(rng: Random) -> str:
    """A system prompt unrelated to the label."""
    return one(rng, phrases("systems")).format(
        biz=one(rng, BUSINESSES),
        lang=one(rng, PROG_LANGS),
        name=one(rng, NAMES),
        date=f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
    )


def reply(rng: Random) -> str:
    """A plausible earlier assistant turn."""
    return one(rng, phrases("replies")).format(lang=one(rng, PROG_LANGS).lower())


def as_chat(rng: Random, user: str, history: list[str]) -> list[dict[str, str]]:
    """Messages with an optional system prompt, ``history`` user turns, then ``user``."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": system_prompt(rng)})
    for turn in history:
        messages.append({"role": "user", "content": turn})
        messages.append({"role": "assistant", "content": reply(rng)})
    messages.append({"role": "user", "content": user})
    return messages


def followup(rng: Random, complex_label: bool) -> tuple[str, str]:
    """A follow-up message (category, text) whose label comes from what it asks."""
    category, text = one(rng, _COMPLEX_FOLLOWUPS if complex_label else _SIMPLE_FOLLOWUPS)
    return category, text.format(lang=one(rng, PROG_LANGS))


def request_fields(rng: Random, complex_label: bool) -> dict[str, Any]:
    """Optional request fields; ``max_tokens`` leans only slightly with the label."""
    fields: dict[str, Any] = {}
    if rng.random() < 0.25:
        fields["max_tokens"] = one(rng, _SIZES[2:] if complex_label else _SIZES[:-1])
    if rng.random() < 0.04:
        fields["tools"] = list(_TOOLS[: rng.randint(1, 2)])
    if rng.random() < 0.1:
        fields["temperature"] = one(rng, (0.0, 0.2, 0.7, 1.0))
    return fields
