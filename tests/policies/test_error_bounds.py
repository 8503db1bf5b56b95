"""docs/security.md: caller text quoted in an error is bounded, 2,000 characters of message
and 128 of ``param``, whatever the caller sent."""

from __future__ import annotations

from policies.errors import InvalidRequest


def test_messages_and_params_quoting_the_caller_are_cut_to_their_bounds() -> None:
    """A 500 kB name in a message and a param: 2,000 and 128 characters come out, marked cut."""
    name = "x" * 500_000
    error = InvalidRequest(f"Unsupported parameter: '{name}'.", param=name)
    assert len(error.message) == 2000
    assert error.message.endswith("…")
    assert error.param is not None
    assert len(error.param) == 128
    assert str(error) == error.message


def test_text_within_the_bounds_is_kept_whole() -> None:
    """At the bounds nothing is cut."""
    error = InvalidRequest("m" * 2000, param="p" * 128)
    assert error.message == "m" * 2000
    assert error.param == "p" * 128
