"""Key format, digests, records and policies."""

from __future__ import annotations

import pytest

from policies.errors import AuthenticationFailed
from policies.keys import (
    KeyRecord,
    PolicyError,
    bearer_token,
    describe,
    issue_key,
    key_digest,
    make_policy,
    parse_key,
    policy_from_dict,
    policy_to_dict,
    rotate_key,
)
from policies.principal import SCOPE_ROUTE_OVERRIDE, KeyPolicy

NOW = 1_700_000_000.0


def test_issued_key_has_prefix_id_and_long_secret() -> None:
    """A key reads tg-<id>-<secret>; the id parses back and the secret is long."""
    record, token = issue_key("team-a", KeyPolicy(), now=NOW)
    prefix, key_id, secret = token.split("-", 2)
    assert prefix == "tg"
    assert key_id == record.key_id
    assert len(secret) >= 43
    assert parse_key(token) == record.key_id


def test_record_keeps_only_a_digest() -> None:
    """The stored record never contains the key or its secret."""
    record, token = issue_key("team-a", KeyPolicy(), now=NOW)
    secret = token.rsplit("-", 1)[1]
    assert token not in str(record.to_dict())
    assert secret not in str(record.to_dict())
    assert record.digest.startswith("sha256:")


def test_keys_are_unique() -> None:
    """Two issued keys never share an id or a secret."""
    tokens = {issue_key("t", KeyPolicy(), now=NOW)[1] for _ in range(200)}
    assert len(tokens) == 200
    assert len({parse_key(t) for t in tokens}) == 200


def test_matches_only_the_exact_key() -> None:
    """Verification accepts the key and rejects any other secret for the same id."""
    record, token = issue_key("t", KeyPolicy(), now=NOW)
    assert record.matches(token, None)
    assert not record.matches(token[:-1] + ("A" if token[-1] != "A" else "B"), None)


def test_pepper_changes_the_digest() -> None:
    """With a pepper the digest is an HMAC, and only verifies with the same pepper."""
    record, token = issue_key("t", KeyPolicy(), now=NOW, pepper=b"pepper")
    assert record.digest.startswith("hmac-sha256:")
    assert record.matches(token, b"pepper")
    assert not record.matches(token, None)
    assert key_digest(token) != key_digest(token, b"pepper")


def test_rotation_keeps_id_and_policy_and_invalidates_old_key() -> None:
    """Rotating gives a new secret for the same id and policy; the old key stops matching."""
    record, old = issue_key("t", KeyPolicy(rpm=5), now=NOW)
    rotated, new = rotate_key(record)
    assert rotated.key_id == record.key_id
    assert rotated.policy == record.policy
    assert rotated.matches(new, None)
    assert not rotated.matches(old, None)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "sk-abc",
        "tg-",
        "tg-abc",
        "tg-ABC-" + "x" * 40,
        "tg-abc-short",
        "tg-a b-" + "x" * 40,
        "xx-abc-" + "x" * 40,
        "tg-abc-" + "é" * 40,
    ],
)
def test_malformed_keys_do_not_parse(token: str) -> None:
    """Anything not shaped like a TierGate key yields no id."""
    assert parse_key(token) is None


def test_record_round_trips_through_a_mapping() -> None:
    """to_dict/from_dict preserve every field."""
    policy = KeyPolicy(
        allowed_tiers=frozenset({"fast"}),
        rpm=1,
        tpm=2,
        max_tokens=3,
        max_concurrency=4,
        expires_at=NOW + 5,
        scopes=frozenset({"downgrade"}),
    )
    record, _ = issue_key("team", policy, now=NOW, name="bot")
    assert KeyRecord.from_dict(record.to_dict()) == record


def test_policy_validation_rejects_bad_values() -> None:
    """Zero or negative limits, unknown fields and empty tier lists are refused."""
    with pytest.raises(ValueError, match="rpm"):
        policy_from_dict({"rpm": 0})
    with pytest.raises(ValueError, match="unknown"):
        policy_from_dict({"rpms": 1})
    with pytest.raises(ValueError, match="tiers"):
        policy_from_dict({"tiers": []})
    assert policy_from_dict(policy_to_dict(KeyPolicy())) == KeyPolicy()


def test_make_policy_checks_scopes_tiers_and_expiry() -> None:
    """Creation options are checked against known scopes and configured tiers."""
    policy = make_policy(
        tiers=["fast"],
        rpm=10,
        expires_in_days=1,
        scopes=[SCOPE_ROUTE_OVERRIDE],
        now=NOW,
        known_tiers=("fast", "precise"),
    )
    assert policy.expires_at == NOW + 86400
    assert policy.allowed_tiers == frozenset({"fast"})
    with pytest.raises(ValueError, match="scopes"):
        make_policy(scopes=["root"], now=NOW)
    with pytest.raises(ValueError, match="tiers"):
        make_policy(tiers=["gpu"], now=NOW, known_tiers=("fast",))


@pytest.mark.parametrize("days", [0, -1, 3650.001, 1e308, float("inf"), float("nan"), True])
def test_expiry_is_bounded_to_ten_years(days: float) -> None:
    """expires_in_days must be finite, positive and at most 3650; the error names the option."""
    with pytest.raises(PolicyError, match="at most 3650") as caught:
        make_policy(expires_in_days=days, now=NOW)
    assert caught.value.param == "expires_in_days"


def test_ten_years_is_accepted() -> None:
    """Exactly 3650 days is the longest expiry."""
    assert make_policy(expires_in_days=3650, now=NOW).expires_at == NOW + 3650 * 86400


@pytest.mark.parametrize(
    "policy",
    [
        {"expires_at": float("inf")},
        {"expires_at": float("nan")},
        {"expires_at": -1},
        {"rpm": 2**60},
        {"tpm": 2**53 + 1},
    ],
)
def test_stored_policies_with_non_finite_or_huge_values_are_refused(
    policy: dict[str, object],
) -> None:
    """A stored policy with an infinite, NaN, negative expiry or a limit above 2**53 is invalid."""
    with pytest.raises(PolicyError):
        policy_from_dict(policy)


def test_usable_and_describe_report_status() -> None:
    """Expired and disabled keys are not usable, and listings say why."""
    record, _ = issue_key("t", KeyPolicy(expires_at=NOW + 10), now=NOW)
    assert record.usable(NOW)
    assert not record.usable(NOW + 10)
    assert describe(record, NOW + 11)["status"] == "expired"
    assert "digest" not in describe(record, NOW)


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "Bearer"])
def test_bearer_token_requires_a_bearer_header(header: str | None) -> None:
    """Missing or non-Bearer headers are 401s."""
    with pytest.raises(AuthenticationFailed):
        bearer_token(header)


def test_bearer_token_error_never_quotes_the_header() -> None:
    """The 401 message does not repeat what the caller sent."""
    with pytest.raises(AuthenticationFailed) as info:
        bearer_token("Token tg-secretive-value")
    assert "secretive" not in info.value.message
    assert bearer_token("bearer  tg-abc ") == "tg-abc"


def test_max_n_defaults_to_one_and_round_trips() -> None:
    """Records without max_n (older ones) allow one completion; a set value is kept."""
    assert policy_from_dict({}).max_n == 1
    policy = policy_from_dict({"max_n": 4})
    assert policy.max_n == 4
    assert policy_from_dict(policy_to_dict(policy)) == policy
    with pytest.raises(ValueError, match="max_n"):
        policy_from_dict({"max_n": 0})
    # docs/vllm-compat.md: a record carries max_n only when it is not 1 (older gateways
    # refuse the field)
    assert "max_n" not in policy_to_dict(policy_from_dict({}))
    assert policy_to_dict(policy)["max_n"] == 4


def test_rule_overrides_round_trip_and_bad_ones_are_refused() -> None:
    """A key's routing rule overrides survive the store's mapping; unknown names or states are
    a PolicyError naming 'rules'; a key without overrides writes no 'rules' field."""
    policy = make_policy(rules=["json_object:on", "tools:off"], now=0.0)
    assert policy.rules == frozenset({"json_object:on", "tools:off"})
    assert policy_from_dict(policy_to_dict(policy)) == policy
    assert "rules" not in policy_to_dict(make_policy(now=0.0))
    for bad in (["json:on"], ["tools:maybe"], ["tools"]):
        with pytest.raises(PolicyError) as caught:
            make_policy(rules=bad, now=0.0)
        assert caught.value.param == "rules"
