"""The cheap tokenizer and chat template."""

from __future__ import annotations

from simulator.tokenize import count_tokens, render_chat, split_pieces, tokenize


def test_tokens_are_words_and_punctuation() -> None:
    """Words and single punctuation marks are tokens; whitespace is not."""
    assert tokenize("Hello, world!  ok") == ["Hello", ",", "world", "!", "ok"]
    assert count_tokens("") == 0


def test_split_pieces_rejoin_to_the_text() -> None:
    """Pieces carry their leading whitespace, so they join back to the (truncated) text."""
    pieces, tokens = split_pieces("one two, three", None)
    assert "".join(pieces) == "one two, three"
    assert tokens == ["one", "two", ",", "three"]
    assert "".join(split_pieces("one two, three", 2)[0]) == "one two"


def test_conversation_render_extends_previous_turn() -> None:
    """Turn N+1's rendered tokens start with turn N's prompt plus the assistant reply."""
    turn1 = [("system", "Be brief.", None), ("user", "Hi", None)]
    reply = "Hello there"
    turn2 = [*turn1, ("assistant", reply, None), ("user", "More?", None)]
    first = tokenize(render_chat(turn1, None)) + tokenize(reply)
    assert tokenize(render_chat(turn2, None))[: len(first)] == first


def test_tools_and_parts_are_rendered() -> None:
    """Tools JSON and text parts of multi-part content are part of the prompt."""
    text = render_chat(
        [("user", [{"type": "text", "text": "look"}, {"type": "image_url"}], None)],
        [{"type": "function", "function": {"name": "f"}}],
    )
    assert '"name":"f"' in text
    assert "look" in text
    assert "<image_url>" in text
